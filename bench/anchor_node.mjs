// llama.cpp through node-llama-cpp's prebuilt CPU binaries, for `kvscope bench --anchor llamacpp`
// (bench/anchor.py): reads {model, threads, max_new_tokens, prompts: [[token ids]]} as JSON on stdin,
// runs each prompt alone and greedy (temperature 0), and prints one JSON object: per prompt the token
// ids generated and the times (ms) from the prompt sent to each generated token.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: job.model, gpuLayers: 0 });
const context = await model.createContext({ contextSize: job.context_size, threads: job.threads, batchSize: 512 });
const sequence = context.getSequence();

async function answer(prompt) {
  await sequence.clearHistory();
  const tokens = [];
  const stamps = [];
  const sent = performance.now();
  for await (const token of sequence.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
    stamps.push(performance.now() - sent);
    tokens.push(token); // an end token too: the engine sends a token event for the end token it chose
    if (model.isEogToken(token) || tokens.length >= job.max_new_tokens) break;
  }
  return { tokens, stamps_ms: stamps };
}

const answers = [];
for (const prompt of job.prompts) answers.push(await answer(prompt));
process.stdout.write(
  JSON.stringify({
    engine: "llama.cpp via node-llama-cpp",
    version: job.version,
    threads: context.currentThreads ?? job.threads,
    gpu: llama.gpu,
    cpu_variant: llama.buildType ?? null,
    answers,
  }),
);
await context.dispose();
await model.dispose();
await llama.dispose();
