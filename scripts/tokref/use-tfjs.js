// Reference run of the Universal Sentence Encoder lite's original TF.js
// graph, for the numerical test of the converted ONNX model
// (node/engine/onnx/use_test.go).
//
// Usage: node use-tfjs.js MODULES_DIR MODEL_DIR < {"ids": [[...], ...]} > vectors.json
//
// MODULES_DIR holds @tensorflow/tfjs-core, -backend-cpu and -converter
// (scripts/assets-use.sh installs them as tokref/tfjs/node_modules);
// MODEL_DIR holds model.json and its weight shards. Each id list is one
// row of the sparse batch, fed exactly as the TF.js wrapper feeds it; the
// output is one vector per row.
"use strict";
const fs = require("fs");
const path = require("path");

async function main() {
  const [modules, dir] = process.argv.slice(2);
  if (!modules || !dir) throw new Error("usage: node use-tfjs.js MODULES_DIR MODEL_DIR");
  const tf = require(path.join(modules, "@tensorflow/tfjs-core"));
  require(path.join(modules, "@tensorflow/tfjs-backend-cpu"));
  const tfc = require(path.join(modules, "@tensorflow/tfjs-converter"));
  const mj = JSON.parse(fs.readFileSync(path.join(dir, "model.json"), "utf8"));
  const weightSpecs = [];
  const bufs = [];
  for (const g of mj.weightsManifest) {
    weightSpecs.push(...g.weights);
    for (const p of g.paths) bufs.push(fs.readFileSync(path.join(dir, p)));
  }
  const all = Buffer.concat(bufs);
  const weightData = all.buffer.slice(all.byteOffset, all.byteOffset + all.byteLength);
  await tf.setBackend("cpu");
  const model = await tfc.loadGraphModel(tf.io.fromMemory({ modelTopology: mj.modelTopology, weightSpecs, weightData }));
  const req = JSON.parse(fs.readFileSync(0, "utf8"));
  const indices = [];
  const values = [];
  req.ids.forEach((row, i) => row.forEach((id, j) => { indices.push([i, j]); values.push(id); }));
  const out = await model.executeAsync({
    indices: tf.tensor2d(indices, [indices.length, 2], "int32"),
    values: tf.tensor1d(values, "int32"),
  });
  process.stdout.write(JSON.stringify(await out.array()));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
