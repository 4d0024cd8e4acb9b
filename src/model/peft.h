/* model/peft: LoRA adapters in Hugging Face PEFT's directory format, written and read.
 *
 *   DIR/adapter_config.json         peft_type LORA, r, lora_alpha, target_modules, task_type
 *                                   CAUSAL_LM, bias none, rank_pattern (ranks other than r), ...
 *   DIR/adapter_model.safetensors   "base_model.model.<module>.lora_A.weight" [r, n_in] (F32) and
 *                                   "base_model.model.<module>.lora_B.weight" [n_out, r]
 *
 * <module> is the transformers name of the projection: model.layers.N.self_attn.{q,k,v,o}_proj,
 * model.layers.N.mlp.{gate,up,down}_proj, lm_head. PEFT computes y = W x + (lora_alpha / r)·B A x,
 * nightlora's and llama.cpp's rule too, so alpha is lora_alpha.
 *
 * The llama architecture's GGUF q and k weights are row-permuted from the Hugging Face ones
 * (llama.cpp's converter, `LlamaModel.permute`: within each head of hd rows, GGUF row 2i + j
 * holds HF row j·hd/2 + i, so the GGUF's adjacent-pair RoPE equals HF's rotate-half); an adapter
 * trained on the GGUF lives in that order. Writing undoes it on the rows of q's and k's B (n_head
 * heads for q, n_head_kv for k; A is untouched), reading redoes it. qwen3 and qwen35 are not
 * permuted. qwen35's gated delta-net projections (in_proj_qkv, in_proj_z, in_proj_a, in_proj_b,
 * out_proj) are refused both ways: the GGUF reorders their value heads (grouped -> tiled) and
 * nightlora does not map that order.
 *
 * Reading refuses, by name, what would compute something else: use_dora, use_rslora,
 * fan_in_fan_out, bias other than "none", lora_bias, modules_to_save, per-module alpha
 * (alpha_pattern), lora_alpha 0 (PEFT's scale 0, where llama.cpp's alpha 0 means scale 1),
 * another peft_type, and any tensor nightlora cannot place (embedding LoRA, an unknown module). */
#ifndef NL_PEFT_H
#define NL_PEFT_H

#include <stddef.h>

#include "model/adapter.h"
#include "model/model.h"

#define NL_PEFT_CONFIG "adapter_config.json"
#define NL_PEFT_WEIGHTS "adapter_model.safetensors"
#define NL_PEFT_MANIFEST "nightlora-manifest.json"

/* The Hugging Face repository the GGUF names (adapter_config's base_model_name_or_path):
 * general.source.huggingface.repository, else a https://huggingface.co/ORG/NAME in
 * general.source.url / general.base_model.0.repo_url / general.url, else a general.name that
 * is an "ORG/NAME" id; NULL when none (buf holds a derived one). */
const char *nl_peft_base_model(const nl_model *m, char *buf, size_t cap);
/* Write `a` (an adapter of m) into the directory dir (created when missing). base_model:
 * adapter_config's base_model_name_or_path; NULL takes the GGUF's
 * general.source.huggingface.repository when it has one, else null. 0 or -1.
 *
 * The pair is whole: a third file, DIR/nightlora-manifest.json, holds the identity (size and
 * every byte, util/hash.h) of both. All three are first written whole beside their names
 * (NAME.new), and only then renamed into place, the manifest first: a failure before the
 * renames (a full disk) leaves DIR as it was, and a crash between them leaves a manifest that
 * does not match the older file still in place, which nl_peft_load refuses, so the weights of
 * one export are never read with the other's lora_alpha. PEFT and transformers ignore the
 * manifest. io: NULL = nl_io_posix() (tests inject faults). */
int nl_peft_save(const nl_adapter *a, const nl_model *m, const char *dir, const char *base_model);
struct nl_io;
int nl_peft_save_io(const struct nl_io *io, const nl_adapter *a, const nl_model *m, const char *dir,
                    const char *base_model);
/* Read a PEFT adapter directory for m (validated like nl_adapter_load). A directory with a
 * nightlora-manifest.json is read only when both files match it ("DIR/adapter_model.safetensors
 * does not match DIR/nightlora-manifest.json ..."); one without (PEFT's own) as it is. */
nl_adapter *nl_peft_load(const nl_model *m, const char *dir);

/* The transformers module name of projection p of m ("model.layers.3.self_attn.q_proj",
 * "lm_head") into buf; 0, or -1 with the error when PEFT naming is not mapped for it. */
int nl_peft_module(const nl_model *m, int p, char *buf, size_t cap);

#endif
