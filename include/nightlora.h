/* nightlora: the public C API (one header).
 *
 * A program that trains or uses LoRA adapters includes this header and links libnightlora
 * (plus -lm -lpthread). Every function returns an int status (0 ok, -1 error) or NULL, and
 * nl_last_error() gives the one-line message (file, offset or line, what was expected).
 *
 *   nl_train_opts o;                      // train/trainer.h: everything `nightlora train` does
 *   nl_train_defaults(&o);
 *   o.model = "qwen3-0.6b-q8_0.gguf"; o.data = "my.jsonl"; o.out = "adapter.gguf";
 *   o.checkpoint_dir = "ckpt"; o.resume = 1;
 *   nl_train_result r;
 *   if (nl_train(&o, &r)) fprintf(stderr, "%s\n", nl_last_error());
 *
 *   nl_session s;                         // eval/session.h: model, vocabulary, adapter, service
 *   nl_session_open(&s, "qwen3-0.6b-q8_0.gguf", "adapter.gguf", NULL);
 *   nl_session_logits(&s, tokens, n, logits);          // or nl_generate, nl_eval_dataset
 *   nl_session_close(&s);
 *
 * The defaults are the CLI's (nl_proj_config_defaults): the host backend on every core up to 8;
 * training keeps the precision policy "auto" (F32/F16 projections resident as Q8_0, recurrent
 * F16), a session opened with no config computes with the weights' stored types ("keep").
 *
 * The room headers below are the contracts (each states its own in a few lines). */
#ifndef NIGHTLORA_H
#define NIGHTLORA_H

#include "util/util.h"        /* nl_last_error, nl_clear_error */
#include "model/gguf.h"       /* GGUF v3 reader / writer */
#include "model/quant.h"      /* tensor types */
#include "model/model.h"      /* architectures, nl_model_load, nl_mkmodel */
#include "model/adapter.h"    /* LoRA adapters: new, load, save, merge */
#include "data/tokenizer.h"   /* tokenizers (nl_tokenizer_for_model: a loaded model's vocabulary) */
#include "data/dataset.h"     /* JSONL data, chat templates, packing */
#include "proj/proj.h"        /* the frozen-projection service */
#include "nn/forward.h"       /* the model forward */
#include "train/trainer.h"    /* nl_train */
#include "eval/session.h"     /* sessions (model, vocabulary, adapter, service), generation */
#include "eval/eval.h"        /* loss, perplexity, accuracy */

#endif
