#!/usr/bin/env python3
"""Resident size of a real node around image work, then 60 s idle.

    python3 scripts/imagerss.py BINARY PORT burst [serve flags...]
    python3 scripts/imagerss.py BINARY PORT png [serve flags...]

burst: six of the heaviest requests the default work limits allow
(2048x2048 at 64 steps, 4 x 1024x1024 at 64 steps), three at a time, on
the generated tiny-sd pipeline, then the issue's 4096x4096 x 4 x 200-step
request (refused). png: a 40-megapixel PNG three times to
/v1/vision/background and to img2img (refused from its header).
Models come from ~/.cache/infermesh (make assets); PORT..PORT+2 are used.
"""
import base64, json, os, struct, subprocess, sys, tempfile, threading, time, urllib.request, zlib, shutil, random
binary, port = sys.argv[1], int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else "burst"
extra = sys.argv[4:]
data = tempfile.mkdtemp()
for m in ["tiny-sd", "isnet"]:
    subprocess.run([binary, "models", "import", "--data-dir", data, os.path.expanduser("~/.cache/infermesh/models/" + m)], check=True, capture_output=True)
log = open(data + "/log", "w")
p = subprocess.Popen([binary, "serve", "--data-dir", data, "--listen", f"127.0.0.1:{port}", "--gossip-listen", f"127.0.0.1:{port+1}",
                      "--rpc-listen", f"127.0.0.1:{port+2}", "--node-id", "rss"] + extra, stdout=log, stderr=log)
def rss():
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith("VmRSS:"): return int(l.split()[1]) * 1024
def mb(x): return f"{x/1e6:.0f} MB"
def post(path, body, timeout=900):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=timeout); r.read(); return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:300]
peak = [0]
stop = [False]
def sampler():
    while not stop[0]:
        try: peak[0] = max(peak[0], rss())
        except Exception: pass
        time.sleep(0.1)
def png40mp():
    w, h = 8000, 5000
    rnd = random.Random(1)
    row = bytes([0]) + bytes(w * 3)
    raw = b"".join(row if y % 50 else bytes([0]) + bytes(rnd.getrandbits(8) for _ in range(w * 3)) for y in range(h))
    def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
try:
    for _ in range(600):
        try: urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1); break
        except Exception: time.sleep(0.5)
    threading.Thread(target=sampler, daemon=True).start()
    print("warm-up", post("/v1/images/generations", {"model": "tiny-sd:test", "prompt": "warm", "size": "64x64", "num_inference_steps": 1}))
    time.sleep(10)
    idle = rss(); print("idle RSS", mb(idle), flush=True)
    if mode == "burst":
        # The heaviest the default limits allow: 2048x2048 (the picture
        # limit) at 64 steps (256 megapixel-steps), and 4 x 1024x1024 at 64.
        bodies = [{"model": "tiny-sd:test", "prompt": "a burst", "size": "2048x2048", "num_inference_steps": 64, "seed": 1},
                  {"model": "tiny-sd:test", "prompt": "a burst", "size": "1024x1024", "n": 4, "num_inference_steps": 64, "seed": 2}]
        t0 = time.time()
        for wave in range(2):
            res = [None] * 3
            def one(i): res[i] = post("/v1/images/generations", bodies[(i + wave) % 2])
            ts = [threading.Thread(target=one, args=(i,)) for i in range(3)]
            [t.start() for t in ts]; [t.join() for t in ts]
            print("wave", wave, [r[0] for r in res], [r[1] for r in res if r[0] != 200][:1], flush=True)
        print(f"burst took {time.time()-t0:.0f} s; peak RSS {mb(peak[0])}; RSS at end {mb(rss())}", flush=True)
        print("issue's request:", post("/v1/images/generations", {"model": "tiny-sd:test", "prompt": "x", "size": "4096x4096", "n": 4, "num_inference_steps": 200}), flush=True)
    else:
        img = png40mp(); print("png bytes", len(img))
        for i in range(3):
            t0 = time.time(); c0 = peak[0]
            st = post("/v1/vision/background", {"image": base64.b64encode(img).decode()})
            print(f"40 MP png to /v1/vision/background: {st[0]} {st[1][:120]!r} in {time.time()-t0:.1f} s; peak {mb(peak[0])}; now {mb(rss())}", flush=True)
            st = post("/v1/images/generations", {"model": "tiny-sd:test", "prompt": "x", "operation": "img2img", "image": base64.b64encode(img).decode()})
            print(f"40 MP png to img2img: {st[0]} {st[1][:160]!r}; now {mb(rss())}", flush=True)
    for s in (10, 30, 60):
        time.sleep(s - (10 if s == 30 else 0) - (30 if s == 60 else 0))
        print(f"after {s} s idle: RSS {mb(rss())} ({rss()/idle:.2f}x idle)", flush=True)
finally:
    stop[0] = True; p.terminate(); p.wait(); shutil.rmtree(data)
