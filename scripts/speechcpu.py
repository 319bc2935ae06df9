#!/usr/bin/env python3
"""CPU seconds of one speech request on a real node.

    python3 scripts/speechcpu.py BINARY PORT [KIND...]

Starts BINARY with Kokoro (~/.cache/infermesh, make assets) on PORT..PORT+2,
posts one /v1/audio/speech request per KIND (default dots: 4096 full
stops; also dotspace, ideo, fullwidth, words, cjkwords, text) and prints
the node's CPU seconds (its own and its finished children's, espeak-ng and
ffmpeg, from /proc/<pid>/stat), the audio length and the wall time.
"""
import json, os, subprocess, sys, tempfile, time, urllib.request, re, shutil
binary, port = sys.argv[1], sys.argv[2]
kinds = sys.argv[3:] or ["dots"]
data = tempfile.mkdtemp()
subprocess.run([binary, "models", "import", "--data-dir", data, os.path.expanduser("~/.cache/infermesh/models/kokoro")], check=True, capture_output=True)
log = open(data + "/log", "w")
p = subprocess.Popen([binary, "serve", "--data-dir", data, "--listen", "127.0.0.1:" + port, "--gossip-listen", "127.0.0.1:" + str(int(port)+1), "--rpc-listen", "127.0.0.1:" + str(int(port)+2), "--node-id", "cpu"], stdout=log, stderr=log)
def cpu():
    f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")
try:
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1); break
        except Exception: time.sleep(0.5)
    inputs = {"dots": "." * 4096, "dotspace": ". " * 2048, "ideo": "。" * 4096, "fullwidth": "．" * 4096,
              "words": "a. " * 1365, "cjkwords": "hello、" * 682, "text": ("The weather is lovely today. " * 200)[:4096]}
    for k in kinds:
        body = json.dumps({"model": "onnx/kokoro/82m-q8", "input": inputs[k], "response_format": "pcm"}).encode()
        c0, t0 = cpu(), time.time()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/speech", body, {"Content-Type": "application/json"})
        try:
            r = urllib.request.urlopen(req, timeout=900); out = r.read(); st = r.status
        except urllib.error.HTTPError as e:
            out = e.read(); st = e.code
        print(f"{k}: status {st}, {len(out)} bytes ({len(out)/48000:.1f} s of audio), CPU {cpu()-c0:.1f} s, wall {time.time()-t0:.1f} s" + (f" {out[:200]!r}" if st != 200 else ""), flush=True)
finally:
    p.terminate(); p.wait(); shutil.rmtree(data)
