// bench/llamacpp/probs.mjs: llama.cpp's next-token probabilities after a token prompt, through
// node-llama-cpp's prebuilt llama.cpp (CPU). Writes the top N as JSON [[token, p], ...].
//   node probs.mjs MODEL.gguf "t0 t1 ..." OUT.json [ADAPTER.gguf] [N]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import fs from "fs";

const [, , modelPath, tokStr, outPath, loraPath, nStr] = process.argv;
const topN = Number(nStr || 10);
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: "never"});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({
    contextSize: 256,
    lora: loraPath ? {adapters: [{filePath: loraPath}]} : undefined,
});
const seq = ctx.getSequence();
const toks = tokStr.trim().split(/\s+/).map(Number);
const items = toks.map((t, i) => (i === toks.length - 1 ? [t, {generateNext: {probabilities: true}}] : t));
const res = await seq.controlledEvaluate(items);
const probs = res[toks.length - 1].next.probabilities; // Map: token -> probability
const top = [...probs.entries()].sort((a, b) => b[1] - a[1]).slice(0, topN);
fs.writeFileSync(outPath, JSON.stringify(top));
