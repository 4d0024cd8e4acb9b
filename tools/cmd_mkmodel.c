/* nightlora mkmodel: write a synthetic model (random weights, real byte-level BPE vocab). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "model/model.h"
#include "model/quant.h"
#include "util/util.h"

int nl_cmd_mkmodel(int argc, char **argv) {
    static const char *const known[] = {"arch", "preset", "out", "type", "seed", NULL};
    if (nl_cli_check("mkmodel", argc, argv, known, NULL)) return 2;
    const char *arch_s = nl_cli_opt(argc, argv, "arch"), *preset = nl_cli_opt(argc, argv, "preset");
    const char *out = nl_cli_opt(argc, argv, "out"), *type_s = nl_cli_opt(argc, argv, "type");
    if (!arch_s || !preset || !out) {
        fprintf(stderr, "nightlora mkmodel: --arch, --preset and --out are required (see 'nightlora help mkmodel')\n");
        return 2;
    }
    int arch = nl_arch_from_name(arch_s);
    if (arch < 0) {
        fprintf(stderr, "nightlora mkmodel: unknown --arch '%s' (expected llama, qwen3, qwen35 or gemma3)\n", arch_s);
        return 2;
    }
    int type = NL_TYPE_F32;
    if (type_s) {
        type = nl_type_from_name(type_s);
        if (type != NL_TYPE_F32 && type != NL_TYPE_F16 && type != NL_TYPE_Q8_0 && type != NL_TYPE_Q4_0 && type != NL_TYPE_Q4_1) {
            fprintf(stderr, "nightlora mkmodel: unknown --type '%s' (expected f32, f16, q8_0, q4_0 or q4_1)\n", type_s);
            return 2;
        }
    }
    uint64_t seed = 42;
    if (nl_cli_u64("mkmodel", argc, argv, "seed", &seed) < 0) return 2;
    double t0 = nl_now();
    if (nl_mkmodel((nl_arch)arch, preset, type, seed, out)) return nl_cli_fail("mkmodel");
    nl_hparams hp;
    nl_mkmodel_hparams((nl_arch)arch, preset, &hp);
    struct stat st;
    double mb = stat(out, &st) == 0 ? (double)st.st_size / (1024.0 * 1024.0) : 0;
    printf("wrote %s: %s %s, %d layers, n_embd %d, vocab %d, %s weights, seed %llu, %.1f MiB in %.1f s\n", out, arch_s, preset,
           hp.n_layer, hp.n_embd, hp.n_vocab, nl_type_name(type), (unsigned long long)seed, mb, nl_now() - t0);
    return 0;
}
