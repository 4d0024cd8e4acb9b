/* nightlora chat: a multi-turn conversation on the terminal. Each line read from stdin is a
 * user turn; the model's reply (through the chat template, with the conversation so far) is
 * printed, then kept as the assistant turn of the next prompt. EOF (or an empty line after
 * "/exit") ends it. The sampling and service flags are generate's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "eval/session.h"
#include "util/util.h"

int nl_cli_render_conv(const nl_tokenizer *tok, const char *tmpl_name, const nl_chat_msg *msgs, int n_msgs,
                       int32_t **ids, int *n) {
    nl_chat_template *ct;
    if (nl_chat_template_open(tok, tmpl_name, &ct)) return -1;
    int rc = nl_chat_template_tokenize(ct, msgs, n_msgs, NULL, true, ids, NULL, n);
    nl_chat_template_free(ct);
    return rc;
}

typedef struct {
    const nl_tokenizer *tok;
    char *text; /* the reply as text (control tokens left out) */
    size_t len, cap;
} reply;

static void on_token(void *user, int32_t id) {
    reply *r = user;
    if (nl_token_is_control(r->tok, id)) return;
    size_t len;
    const char *p = nl_token_piece(r->tok, id, &len);
    if (!p) return;
    fwrite(p, 1, len, stdout);
    fflush(stdout);
    if (r->len + len + 1 > r->cap) {
        size_t cap = (r->len + len + 1) * 2;
        char *t = realloc(r->text, cap);
        if (!t) return; /* the history keeps what fitted; the reply was printed */
        r->text = t;
        r->cap = cap;
    }
    memcpy(r->text + r->len, p, len);
    r->len += len;
    r->text[r->len] = 0;
}

/* The conversation: role/content pairs, owned. */
typedef struct {
    nl_chat_msg *m;
    int n, cap;
} conv;

static int conv_add(conv *c, const char *role, const char *text, size_t len) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        nl_chat_msg *m = realloc(c->m, (size_t)cap * sizeof *m);
        if (!m) return nl_err("out of memory");
        c->m = m;
        c->cap = cap;
    }
    char *s = malloc(len + 1);
    if (!s) return nl_err("out of memory");
    memcpy(s, text, len);
    s[len] = 0;
    c->m[c->n++] = (nl_chat_msg){role, s, len, NULL};
    return 0;
}

static void conv_free(conv *c) {
    for (int i = 0; i < c->n; i++) free((char *)c->m[i].content);
    free(c->m);
}

int nl_cmd_chat(int argc, char **argv) {
    static const char *const known[] = {"model",         "adapter", "system",        "n",       "temp", "top-p",
                                        "seed",          "backend", "vulkan-device", "threads", "wire", "precision",
                                        "precision-map", "compute", "template",      NULL};
    static const char *const boolean[] = {"verbose", "no-plan-cache", NULL};
    if (nl_cli_check("chat", argc, argv, known, boolean)) return 2;
    const char *model = nl_cli_opt(argc, argv, "model"), *system = nl_cli_opt(argc, argv, "system");
    if (!model) {
        fprintf(stderr, "nightlora chat: --model is required\n");
        return 2;
    }
    nl_proj_config cfg;
    if (nl_cli_infer_config("chat", argc, argv, &cfg)) return 2;
    nl_sample_params sp;
    if (nl_cli_sample_params("chat", argc, argv, 256, &sp)) return 2;
    nl_session s;
    if (nl_session_open(&s, model, nl_cli_opt(argc, argv, "adapter"), &cfg)) return nl_cli_fail("chat");
    nl_cli_model_warning("chat", s.m);
    int rc = 0;
    conv c = {0};
    if (!s.tok) rc = nl_err("%s: the model has no tokenizer vocabulary", model);
    if (!rc && system) rc = conv_add(&c, "system", system, strlen(system));
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int turn = 0;
    while (!rc && (got = getline(&line, &cap, stdin)) >= 0) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!strcmp(line, "/exit")) break;
        if (got == 0) continue;
        if ((rc = conv_add(&c, "user", line, (size_t)got))) break;
        int32_t *ids = NULL;
        int n = 0;
        if ((rc = nl_cli_render_conv(s.tok, nl_cli_opt(argc, argv, "template"), c.m, c.n, &ids, &n))) break;
        reply r = {.tok = s.tok};
        /* each turn its own sampling stream, reproducible from --seed */
        nl_sample_params tp = sp;
        tp.seed = sp.seed + (uint64_t)turn++;
        rc = nl_generate(&s, ids, n, &tp, on_token, &r, NULL, NULL);
        printf("\n");
        fflush(stdout);
        free(ids);
        if (!rc) rc = conv_add(&c, "assistant", r.text ? r.text : "", r.len);
        free(r.text);
    }
    free(line);
    if (!rc && nl_model_check_unchanged(s.m, model, "chat", "the replies above are not to be trusted")) rc = -1;
    conv_free(&c);
    nl_session_close(&s);
    return rc ? nl_cli_fail("chat") : 0;
}
