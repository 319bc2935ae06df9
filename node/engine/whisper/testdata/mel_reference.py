#!/usr/bin/python3
# Reference log-mel values for mel_test.go, computed independently of the Go
# code with numpy (np.fft.rfft, float64) following openai/whisper audio.py
# and librosa.filters.mel(htk=False, norm="slaney").
#
# Regenerate (Debian python3-numpy):
#   /usr/bin/python3 node/engine/whisper/testdata/mel_reference.py > node/engine/whisper/testdata/mel_reference.txt
#
# The signal is synthetic and defined by integer arithmetic so that the Go
# test builds the same float32 samples: a 440 Hz tone, a chirp and LCG noise.
import numpy as np

SR, NFFT, HOP, NSAMP = 16000, 400, 160, 480000


def signal(n=88000):
    state = 12345
    out = np.empty(n, np.float32)
    for i in range(n):
        state = (state * 1103515245 + 12345) % 2147483648
        t = i / SR
        v = 0.5 * np.sin(2 * np.pi * 440 * t) + 0.3 * np.sin(2 * np.pi * (200 + 1000 * t) * t)
        v += 0.05 * (state / 2147483648 - 0.5)
        if i > 60000:  # a quieter tail, so the max-8 clamp matters
            v *= 1e-4
        out[i] = np.float32(v)
    return out


def slaney(n_mels):
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, step = min_log_hz / f_sp, np.log(6.4) / 27.0
    def to_mel(f):
        return min_log_mel + np.log(f / min_log_hz) / step if f >= min_log_hz else f / f_sp
    def to_hz(m):
        return np.where(m >= min_log_mel, min_log_hz * np.exp(step * (m - min_log_mel)), m * f_sp)
    freqs = np.linspace(0, SR / 2, NFFT // 2 + 1)
    pts = to_hz(np.linspace(to_mel(0.0), to_mel(SR / 2), n_mels + 2))
    w = np.zeros((n_mels, len(freqs)))
    for i in range(n_mels):
        lower = (freqs - pts[i]) / (pts[i + 1] - pts[i])
        upper = (pts[i + 2] - freqs) / (pts[i + 2] - pts[i + 1])
        w[i] = np.maximum(0, np.minimum(lower, upper)) * 2.0 / (pts[i + 2] - pts[i])
    return w.astype(np.float32)


def log_mel(x, n_mels):
    x = np.concatenate([x, np.zeros(NSAMP - len(x), np.float32)])
    xp = np.pad(x.astype(np.float64), NFFT // 2, mode="reflect")
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(NFFT) / NFFT)
    n = 1 + (len(xp) - NFFT) // HOP
    frames = np.stack([xp[i * HOP:i * HOP + NFFT] * win for i in range(n)])
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    mel = slaney(n_mels).astype(np.float64) @ power[:-1].T
    lg = np.log10(np.maximum(mel, 1e-10))
    lg = np.maximum(lg, lg.max() - 8.0)
    return (lg + 4.0) / 4.0


x = signal()
for n_mels in (80, 128):
    m = log_mel(x, n_mels)
    rng = np.random.RandomState(7)
    print("# n_mels %d shape %s mean %.9f" % (n_mels, m.shape, m.mean()))
    picks = [(0, 0), (n_mels - 1, 2999), (10, 1), (40, 370), (20, 376), (5, 2999)]
    picks += list(zip(rng.randint(0, n_mels, 150), rng.randint(0, 3000, 150)))
    for b, f in picks:
        print("%d %d %d %.9f" % (n_mels, b, f, m[b, f]))
