// Runs a TF.js graph model with TF.js's own pure-JS CPU kernels, for the
// reference numbers of the converter test (see gen_reference.py).
// node tfjs_run.js MODEL.json INPUT.f32 D0,D1,D2,D3 INPUT_NAME OUT_PREFIX OUTPUT[,OUTPUT...]
// writes OUT_PREFIX<i>.f32 per output, in order.
const tf = require('@tensorflow/tfjs');
const fs = require('fs');
const path = require('path');
(async () => {
  await tf.setBackend('cpu');
  const [mj, inFile, dims, inName, prefix, outs] = process.argv.slice(2);
  const j = JSON.parse(fs.readFileSync(mj));
  const specs = [], bufs = [];
  for (const g of j.weightsManifest) {
    for (const w of g.weights) specs.push(w);
    for (const p of g.paths) bufs.push(fs.readFileSync(path.join(path.dirname(mj), p)));
  }
  const all = Buffer.concat(bufs);
  const model = await tf.loadGraphModel({load: async () => ({
    modelTopology: j.modelTopology, weightSpecs: specs, format: j.format,
    weightData: all.buffer.slice(all.byteOffset, all.byteOffset + all.length)})});
  const b = fs.readFileSync(inFile);
  const x = tf.tensor(new Float32Array(b.buffer, b.byteOffset, b.length / 4), dims.split(',').map(Number));
  let ys = await model.executeAsync({[inName]: x}, outs.split(','));
  if (!Array.isArray(ys)) ys = [ys];
  for (let i = 0; i < ys.length; i++) {
    fs.writeFileSync(prefix + i + '.f32', Buffer.from(new Float32Array(await ys[i].data()).buffer));
  }
})().catch(e => { console.error(e); process.exit(1); });
