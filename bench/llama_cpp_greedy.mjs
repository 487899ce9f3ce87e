// Greedy continuation by llama.cpp (node-llama-cpp's prebuilt binding) of given prompt token ids:
// checks that a GGUF from tools/gguf_from_checkpoint.py computes the model we compute.
//   node llama_cpp_greedy.mjs MODEL.gguf ID,ID,... N   -> a JSON array of N token ids
import {getLlama} from "node-llama-cpp";

const [modelPath, promptIds, count] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 256, threads: 2});
const tokens = [];
for await (const token of context.getSequence().evaluate(promptIds.split(",").map(Number), {temperature: 0})) {
  tokens.push(token);
  if (tokens.length >= Number(count)) break;
}
console.log(JSON.stringify(tokens));
process.exit(0);
