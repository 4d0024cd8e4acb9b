/* nightlora mkmodel: write a synthetic model (random weights, real byte-level BPE vocab), through
 * the public API (nightlora_mkmodel). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "nightlora.h"
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
    nightlora_mkmodel_params mp;
    nightlora_mkmodel_default_params(&mp);
    mp.arch = arch_s;
    mp.preset = preset;
    if (type_s) mp.type = type_s;
    if (nl_cli_u64("mkmodel", argc, argv, "seed", &mp.seed) < 0) return 2;
    double t0 = nl_now();
    /* the public API checks arch, preset and type (one list of each: api.c) and writes the file */
    if (nightlora_mkmodel(out, &mp)) { /* its message begins "mkmodel: " */
        fprintf(stderr, "nightlora %s\n", nightlora_last_error());
        return 2;
    }
    /* the line that describes what was written: the preset's shape */
    const int arch = nl_arch_from_name(arch_s), type = nl_type_from_name(mp.type);
    nl_hparams hp;
    nl_mkmodel_hparams((nl_arch)arch, preset, &hp);
    struct stat st;
    double mb = stat(out, &st) == 0 ? (double)st.st_size / (1024.0 * 1024.0) : 0;
    printf("wrote %s: %s %s, %d layers, n_embd %d, vocab %d, %s weights, seed %llu, %.1f MiB in %.1f s\n", out, arch_s,
           preset, hp.n_layer, hp.n_embd, hp.n_vocab, nl_type_name(type), (unsigned long long)mp.seed, mb,
           nl_now() - t0);
    return 0;
}
