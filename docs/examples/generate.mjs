// Stream a completion from the muestra gateway in Node.js, with stubs built from proto/ at run time.
//   npm install @grpc/grpc-js @grpc/proto-loader
//   node docs/examples/generate.mjs 127.0.0.1:50051 "El cielo es"
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import { fileURLToPath } from "node:url";
import path from "node:path";

const protoRoot = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "proto");
const definition = protoLoader.loadSync("muestra/v1/gateway.proto", {
  includeDirs: [protoRoot],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});
const muestra = grpc.loadPackageDefinition(definition).muestra.v1;

const [address = "127.0.0.1:50051", prompt = "El cielo es"] = process.argv.slice(2);
const gateway = new muestra.Gateway(address, grpc.credentials.createInsecure());
const call = gateway.Generate({
  prompt,
  max_tokens: 32,
  seed: 1,
  samplers: [
    { name: "temperature", params: { fields: { temperature: { number_value: 0.7 } } } },
    { name: "top_p", params: { fields: { top_p: { number_value: 0.9 } } } },
    { name: "sample" },
  ],
});
call.on("data", (message) => {
  if (message.delta) process.stdout.write(message.delta.text);
  if (message.done) console.log(`\n[${message.done.finish_reason}, ${message.done.usage.completion_tokens} tokens]`);
});
call.on("error", (error) => console.error(`${error.code}: ${error.details}`));
