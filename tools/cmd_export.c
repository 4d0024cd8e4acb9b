/* nightlora export: an adapter in another format — a PEFT directory (model/peft.h) from a
 * llama.cpp LoRA GGUF, or a GGUF from a PEFT directory. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/adapter.h"
#include "model/model.h"
#include "model/peft.h"

int nl_cmd_export(int argc, char **argv) {
    static const char *const known[] = {"model", "adapter", "format", "out", "base-model", NULL};
    if (nl_cli_check("export", argc, argv, known, NULL)) return 2;
    const char *model = nl_cli_opt(argc, argv, "model"), *adapter = nl_cli_opt(argc, argv, "adapter"),
               *format = nl_cli_opt(argc, argv, "format"), *out = nl_cli_opt(argc, argv, "out"),
               *base = nl_cli_opt(argc, argv, "base-model");
    if (!model || !adapter || !format || !out) {
        fprintf(stderr, "nightlora export: --model, --adapter, --format and --out are required (the model gives the "
                        "architecture and the heads the PEFT names and the q/k row order need)\n");
        return 2;
    }
    int peft = !strcmp(format, "peft");
    if (!peft && strcmp(format, "gguf")) {
        fprintf(stderr,
                "nightlora export: --format %s: expected peft (a PEFT directory) or gguf (a llama.cpp LoRA GGUF)\n",
                format);
        return 2;
    }
    if (base && !peft) {
        fprintf(stderr, "nightlora export: --base-model names the PEFT config's base_model_name_or_path: only with "
                        "--format peft\n");
        return 2;
    }
    static const char *const inputs[] = {"model", "adapter", NULL}, *const outputs[] = {"out", NULL};
    if (nl_cli_no_overwrite("export", argc, argv, inputs, outputs, NULL)) return 2;
    nl_model *m = nl_model_load(model);
    if (!m) return nl_cli_fail("export");
    nl_cli_model_warning("export", m);
    char bb[256];
    if (peft && !base && !nl_peft_base_model(m, bb, sizeof bb))
        fprintf(stderr,
                "nightlora export: warning: %s names no Hugging Face repository (general.source.huggingface.repository,"
                " a huggingface.co URL or an ORG/NAME general.name): base_model_name_or_path is null; give --base-model"
                " ORG/NAME so that AutoPeftModelForCausalLM can load the base\n",
                model);
    nl_adapter *a = nl_adapter_load(m, adapter);
    int rc = (!a || (peft ? nl_peft_save(a, m, out, base) : nl_adapter_save(a, m, out))) ? nl_cli_fail("export") : 0;
    if (rc == 0) {
        int qk = 0;
        for (int i = 0; i < a->n && m->arch == NL_ARCH_LLAMA; i++)
            qk |= m->projs[a->t[i].proj].kind == NL_P_Q || m->projs[a->t[i].proj].kind == NL_P_K;
        printf("wrote %s: %s, %d adapted projections, rank %d, alpha %g%s\n", out,
               peft ? "PEFT LoRA adapter (" NL_PEFT_CONFIG " + " NL_PEFT_WEIGHTS ")" : "llama.cpp LoRA GGUF", a->n,
               a->rank, (double)a->alpha,
               !qk    ? ""
               : peft ? "; q/k lora_B rows in transformers' order"
                      : "; q/k lora_b rows in the GGUF's order");
    }
    nl_adapter_free(a);
    nl_model_free(m);
    return rc;
}
