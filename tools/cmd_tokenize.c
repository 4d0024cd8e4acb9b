/* nightlora tokenize --model M.gguf --text TEXT [--no-special] [--pieces]
 * Prints the token ids of TEXT, space-separated on one line (--pieces: one token a line, its id
 * and its piece as a JSON string). By default BOS/EOS are added as the
 * vocabulary says and control-token text is parsed; --no-special turns both off. Only the
 * GGUF's metadata is read (no tensors are loaded). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data/tokenizer.h"
#include "model/gguf.h"
#include "util/util.h"

int nl_cmd_tokenize(int argc, char **argv) {
    static const char *const known[] = {"model", "text", "no-special", "special", "pieces", NULL};
    static const char *const boolean[] = {"no-special", "special", "pieces", NULL};
    if (nl_cli_check("tokenize", argc, argv, known, boolean)) return 2;
    const char *model = nl_cli_opt(argc, argv, "model");
    const char *text = nl_cli_opt(argc, argv, "text");
    if (!model || !text) {
        fprintf(stderr, "usage: nightlora tokenize --model M.gguf --text TEXT [--no-special] [--pieces]\n");
        return 2;
    }
    bool special = !nl_cli_flag(argc, argv, "no-special");
    nl_gguf *g = nl_gguf_open(model);
    if (!g) return nl_cli_fail("tokenize");
    nl_tokenizer *t = nl_tokenizer_from_gguf(g);
    if (!t) {
        nl_gguf_close(g);
        return nl_cli_fail("tokenize");
    }
    int32_t *ids = NULL;
    int n = 0;
    int rc = nl_tokenize(t, text, strlen(text), special, special, &ids, &n);
    if (rc == 0) {
        if (nl_cli_flag(argc, argv, "pieces")) {
            for (int i = 0; i < n; i++) {
                size_t len;
                const char *p = nl_token_piece(t, ids[i], &len);
                char *piece = p ? strndup(p, len) : NULL;
                printf("%d ", ids[i]);
                nl_cli_json_str(piece);
                printf("%s\n", nl_token_is_control(t, ids[i]) ? " control" : "");
                free(piece);
            }
        } else {
            for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
        }
    }
    free(ids);
    nl_tokenizer_free(t);
    nl_gguf_close(g);
    return rc == 0 ? 0 : nl_cli_fail("tokenize");
}
