// Pixel kernels of package vision (see pixels_cgo.go). Built with
// -ffp-contract=off and without -ffast-math: every float operation is
// rounded on its own (no fused multiply-add, no reassociation), so each
// code path (plain C, SSE2, AVX2) gives the same bits as the Go reference
// in pixels_test.go. The vector paths only do, lane by lane, the very
// operations of the plain loops in the same order.

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

// No contraction of a*b + c into one fused multiply-add: clang honours
// the pragma; GCC ignores it but does not contract in ISO C mode.
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#if defined(__GNUC__) && !defined(__clang__) && !defined(__STRICT_ANSI__)
#error "pixels.c needs ISO C mode (-std=c11) so that GCC does not fuse multiply-adds"
#endif

#include "pixels.h"

#if defined(__x86_64__) && defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#define IM_X86 1
#include <immintrin.h>
#else
#define IM_X86 0
#endif

int im_simd_level(void) {
#if IM_X86
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2")) {
		return 2;
	}
	return 1;
#else
	return 0;
#endif
}

// level clamps a requested level to what this CPU has; a negative request
// asks for the best one.
static int im_level(int want) {
	int best = im_simd_level();
	if (want < 0 || want > best) {
		return best;
	}
	return want;
}

// ---- Resampling -------------------------------------------------------
//
// vert_* computes out[x] = w[0]*row0[x] + w[1]*row1[x] + ... (left to
// right, each product rounded, then each sum) for x in [0, n), row k being
// base + k*stride: the vertical filter of one output row over the RGBA
// bytes of the source columns it needs.

static void vert_plain(const uint8_t *base, ptrdiff_t stride, const float *w, int c, int n, float *out) {
	float w0 = w[0];
	for (int x = 0; x < n; x++) {
		out[x] = w0 * (float)base[x];
	}
	for (int k = 1; k < c; k++) {
		const uint8_t *r = base + k * stride;
		float wk = w[k];
		for (int x = 0; x < n; x++) {
			out[x] = out[x] + wk * (float)r[x];
		}
	}
}

#if IM_X86
static void vert_sse2(const uint8_t *base, ptrdiff_t stride, const float *w, int c, int n, float *out) {
	const __m128i zero = _mm_setzero_si128();
	int x = 0;
	for (; x + 16 <= n; x += 16) {
		__m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
		for (int k = 0; k < c; k++) {
			__m128i v = _mm_loadu_si128((const __m128i *)(base + k * stride + x));
			__m128i lo = _mm_unpacklo_epi8(v, zero), hi = _mm_unpackhi_epi8(v, zero);
			__m128 f0 = _mm_cvtepi32_ps(_mm_unpacklo_epi16(lo, zero));
			__m128 f1 = _mm_cvtepi32_ps(_mm_unpackhi_epi16(lo, zero));
			__m128 f2 = _mm_cvtepi32_ps(_mm_unpacklo_epi16(hi, zero));
			__m128 f3 = _mm_cvtepi32_ps(_mm_unpackhi_epi16(hi, zero));
			__m128 wk = _mm_set1_ps(w[k]);
			if (k == 0) {
				a0 = _mm_mul_ps(wk, f0);
				a1 = _mm_mul_ps(wk, f1);
				a2 = _mm_mul_ps(wk, f2);
				a3 = _mm_mul_ps(wk, f3);
			} else {
				a0 = _mm_add_ps(a0, _mm_mul_ps(wk, f0));
				a1 = _mm_add_ps(a1, _mm_mul_ps(wk, f1));
				a2 = _mm_add_ps(a2, _mm_mul_ps(wk, f2));
				a3 = _mm_add_ps(a3, _mm_mul_ps(wk, f3));
			}
		}
		_mm_storeu_ps(out + x, a0);
		_mm_storeu_ps(out + x + 4, a1);
		_mm_storeu_ps(out + x + 8, a2);
		_mm_storeu_ps(out + x + 12, a3);
	}
	if (x < n) {
		vert_plain(base + x, stride, w, c, n - x, out + x);
	}
}

__attribute__((target("avx2"))) static void vert_avx2(const uint8_t *base, ptrdiff_t stride, const float *w, int c, int n, float *out) {
	int x = 0;
	for (; x + 32 <= n; x += 32) {
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
		for (int k = 0; k < c; k++) {
			const uint8_t *p = base + k * stride + x;
			__m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
			__m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))));
			__m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16))));
			__m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 24))));
			__m256 wk = _mm256_set1_ps(w[k]);
			if (k == 0) {
				a0 = _mm256_mul_ps(wk, f0);
				a1 = _mm256_mul_ps(wk, f1);
				a2 = _mm256_mul_ps(wk, f2);
				a3 = _mm256_mul_ps(wk, f3);
			} else {
				a0 = _mm256_add_ps(a0, _mm256_mul_ps(wk, f0));
				a1 = _mm256_add_ps(a1, _mm256_mul_ps(wk, f1));
				a2 = _mm256_add_ps(a2, _mm256_mul_ps(wk, f2));
				a3 = _mm256_add_ps(a3, _mm256_mul_ps(wk, f3));
			}
		}
		_mm256_storeu_ps(out + x, a0);
		_mm256_storeu_ps(out + x + 8, a1);
		_mm256_storeu_ps(out + x + 16, a2);
		_mm256_storeu_ps(out + x + 24, a3);
	}
	if (x < n) {
		vert_sse2(base + x, stride, w, c, n - x, out + x);
	}
}
#endif

// horiz_* filters the vertically filtered row v (RGBA floats, column
// cx0 at v[0]) horizontally into dw RGB pixels v*mul + add: pixel i is
// w[i*wn] * px(first[i]) + w[i*wn+1] * px(first[i]+1) + ..., count[i]
// taps (none: 0).

static void horiz_plain(const float *v, int cx0, const int32_t *first, const int32_t *count, const float *w, int wn,
	int dw, float mul, float add, float *out) {
	for (int i = 0; i < dw; i++) {
		int c = count[i];
		const float *ws = w + (ptrdiff_t)i * wn;
		float r = 0, g = 0, b = 0;
		if (c > 0) {
			const float *p = v + 4 * (ptrdiff_t)(first[i] - cx0);
			r = ws[0] * p[0];
			g = ws[0] * p[1];
			b = ws[0] * p[2];
			for (int k = 1; k < c; k++) {
				r = r + ws[k] * p[4 * k];
				g = g + ws[k] * p[4 * k + 1];
				b = b + ws[k] * p[4 * k + 2];
			}
		}
		out[3 * i] = r * mul + add;
		out[3 * i + 1] = g * mul + add;
		out[3 * i + 2] = b * mul + add;
	}
}

#if IM_X86
// horiz_sse2: one pixel (R, G, B, A) per vector.
static void horiz_sse2(const float *v, int cx0, const int32_t *first, const int32_t *count, const float *w, int wn,
	int dw, float mul, float add, float *out) {
	const __m128 vm = _mm_set1_ps(mul), va = _mm_set1_ps(add);
	for (int i = 0; i < dw; i++) {
		int c = count[i];
		const float *ws = w + (ptrdiff_t)i * wn;
		__m128 a = _mm_setzero_ps();
		if (c > 0) {
			const float *p = v + 4 * (ptrdiff_t)(first[i] - cx0);
			a = _mm_mul_ps(_mm_set1_ps(ws[0]), _mm_loadu_ps(p));
			for (int k = 1; k < c; k++) {
				a = _mm_add_ps(a, _mm_mul_ps(_mm_set1_ps(ws[k]), _mm_loadu_ps(p + 4 * k)));
			}
		}
		a = _mm_add_ps(_mm_mul_ps(a, vm), va);
		if (i + 1 < dw) {
			// The fourth lane lands on the next pixel's red, written next.
			_mm_storeu_ps(out + 3 * i, a);
		} else {
			float t[4];
			_mm_storeu_ps(t, a);
			out[3 * i] = t[0];
			out[3 * i + 1] = t[1];
			out[3 * i + 2] = t[2];
		}
	}
}
#endif

void im_resample_band(const uint8_t *pix, ptrdiff_t stride, int cx0, int cx1,
	const int32_t *xfirst, const int32_t *xcount, const float *xw, int xn, int dw,
	const int32_t *yfirst, const int32_t *ycount, const float *yw, int yn,
	int j0, int j1, float mul, float add, float *dst, float *vrow, int level) {
	level = im_level(level);
	int n = 4 * (cx1 - cx0);
	for (int j = j0; j < j1; j++) {
		float *o = dst + (ptrdiff_t)(j - j0) * dw * 3;
		int c = ycount[j];
		if (c == 0) {
			for (int i = 0; i < 3 * dw; i++) {
				o[i] = add;
			}
			continue;
		}
		const uint8_t *base = pix + (ptrdiff_t)yfirst[j] * stride + 4 * (ptrdiff_t)cx0;
		const float *ws = yw + (ptrdiff_t)j * yn;
		if (n > 0) {
#if IM_X86
			if (level >= 2) {
				vert_avx2(base, stride, ws, c, n, vrow);
			} else if (level == 1) {
				vert_sse2(base, stride, ws, c, n, vrow);
			} else {
				vert_plain(base, stride, ws, c, n, vrow);
			}
#else
			vert_plain(base, stride, ws, c, n, vrow);
#endif
		}
#if IM_X86
		if (level >= 1) {
			horiz_sse2(vrow, cx0, xfirst, xcount, xw, xn, dw, mul, add, o);
			continue;
		}
#endif
		horiz_plain(vrow, cx0, xfirst, xcount, xw, xn, dw, mul, add, o);
	}
}

// ---- Rotated crop -----------------------------------------------------

// im_floor_int is Go's int(math.Floor(x)) on amd64: values outside the
// int64 range (and NaN) give the minimum int64. (Inline: without SSE4.1,
// floor() is a library call.)
static inline int64_t im_floor_int(double x) {
	if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) {
		return INT64_MIN;
	}
	int64_t i = (int64_t)x; // towards zero
	if ((double)i > x) {
		i--;
	}
	return i;
}

static inline float im_bilerp(float tl, float tr, float bl, float br, float fx, float fy) {
	float top = tl + (tr - tl) * fx;
	float bot = bl + (br - bl) * fx;
	return top + (bot - top) * fy;
}

// im_at reads channel ch of pixel (x, y), black outside the image.
static inline float im_at(const uint8_t *pix, ptrdiff_t stride, int64_t w, int64_t h, int64_t x, int64_t y, int ch) {
	if (x < 0 || y < 0 || x >= w || y >= h) {
		return 0;
	}
	return (float)pix[y * stride + 4 * x + ch];
}

static void rot_plain(const uint8_t *pix, ptrdiff_t stride, int64_t w, int64_t h, double cx, double cy, double cs,
	double sn, const double *offs, int k, int size, int j0, int j1, float *dst, float mul, float add) {
	float inv = 1 / (float)(k * k);
	for (int j = j0; j < j1; j++) {
		for (int i = 0; i < size; i++) {
			float acc[3] = {0, 0, 0};
			for (int sj = 0; sj < k; sj++) {
				double v = offs[j * k + sj];
				double vsin = v * sn, vcos = v * cs;
				for (int si = 0; si < k; si++) {
					double u = offs[i * k + si];
					double x = cx + u * cs - vsin - 0.5;
					double y = cy + u * sn + vcos - 0.5;
					int64_t x0 = im_floor_int(x), y0 = im_floor_int(y);
					float fx = (float)(x - (double)x0), fy = (float)(y - (double)y0);
					for (int ch = 0; ch < 3; ch++) {
						acc[ch] += im_bilerp(im_at(pix, stride, w, h, x0, y0, ch), im_at(pix, stride, w, h, x0 + 1, y0, ch),
							im_at(pix, stride, w, h, x0, y0 + 1, ch), im_at(pix, stride, w, h, x0 + 1, y0 + 1, ch), fx, fy);
					}
				}
			}
			float *o = dst + ((ptrdiff_t)j * size + i) * 3;
			for (int ch = 0; ch < 3; ch++) {
				o[ch] = acc[ch] * inv * mul + add;
			}
		}
	}
}

#if IM_X86
// im_px4 is pixel (x, y) as 4 floats (R, G, B, A), black outside.
static inline __m128 im_px4(const uint8_t *pix, ptrdiff_t stride, int64_t w, int64_t h, int64_t x, int64_t y) {
	if (x < 0 || y < 0 || x >= w || y >= h) {
		return _mm_setzero_ps();
	}
	const __m128i zero = _mm_setzero_si128();
	int32_t v;
	__builtin_memcpy(&v, pix + y * stride + 4 * x, 4);
	__m128i b = _mm_unpacklo_epi8(_mm_cvtsi32_si128(v), zero);
	return _mm_cvtepi32_ps(_mm_unpacklo_epi16(b, zero));
}

// rot_sse2 is rot_plain with the three channels (and alpha, unused) of a
// sample in one vector.
static void rot_sse2(const uint8_t *pix, ptrdiff_t stride, int64_t w, int64_t h, double cx, double cy, double cs,
	double sn, const double *offs, int k, int size, int j0, int j1, float *dst, float mul, float add) {
	const __m128i zero = _mm_setzero_si128();
	const __m128 vinv = _mm_set1_ps(1 / (float)(k * k)), vm = _mm_set1_ps(mul), va = _mm_set1_ps(add);
	for (int j = j0; j < j1; j++) {
		for (int i = 0; i < size; i++) {
			__m128 acc = _mm_setzero_ps();
			for (int sj = 0; sj < k; sj++) {
				double v = offs[j * k + sj];
				double vsin = v * sn, vcos = v * cs;
				for (int si = 0; si < k; si++) {
					double u = offs[i * k + si];
					double x = cx + u * cs - vsin - 0.5;
					double y = cy + u * sn + vcos - 0.5;
					int64_t x0 = im_floor_int(x), y0 = im_floor_int(y);
					__m128 fx = _mm_set1_ps((float)(x - (double)x0)), fy = _mm_set1_ps((float)(y - (double)y0));
					__m128 tl, tr, bl, br;
					if (x0 >= 0 && y0 >= 0 && x0 + 1 < w && y0 + 1 < h) {
						const uint8_t *p = pix + y0 * stride + 4 * x0;
						__m128i a = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)p), zero);
						__m128i b = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(p + stride)), zero);
						tl = _mm_cvtepi32_ps(_mm_unpacklo_epi16(a, zero));
						tr = _mm_cvtepi32_ps(_mm_unpackhi_epi16(a, zero));
						bl = _mm_cvtepi32_ps(_mm_unpacklo_epi16(b, zero));
						br = _mm_cvtepi32_ps(_mm_unpackhi_epi16(b, zero));
					} else {
						tl = im_px4(pix, stride, w, h, x0, y0);
						tr = im_px4(pix, stride, w, h, x0 + 1, y0);
						bl = im_px4(pix, stride, w, h, x0, y0 + 1);
						br = im_px4(pix, stride, w, h, x0 + 1, y0 + 1);
					}
					__m128 top = _mm_add_ps(tl, _mm_mul_ps(_mm_sub_ps(tr, tl), fx));
					__m128 bot = _mm_add_ps(bl, _mm_mul_ps(_mm_sub_ps(br, bl), fx));
					acc = _mm_add_ps(acc, _mm_add_ps(top, _mm_mul_ps(_mm_sub_ps(bot, top), fy)));
				}
			}
			__m128 r = _mm_add_ps(_mm_mul_ps(_mm_mul_ps(acc, vinv), vm), va);
			float *o = dst + ((ptrdiff_t)j * size + i) * 3;
			if (i + 1 < size) {
				_mm_storeu_ps(o, r); // the fourth lane is the next pixel's, written next
			} else {
				float t[4];
				_mm_storeu_ps(t, r);
				o[0] = t[0];
				o[1] = t[1];
				o[2] = t[2];
			}
		}
	}
}
// rot_batch is rot_sse2 computing the coordinates of a whole row of
// sub-samples at a time (loops the compiler vectorises: u*cos and u*sin
// once per call, floor by truncation and correction), then the bilinear
// samples from those arrays. Same operations on the same values, so the
// same bits. A row whose coordinates are not all within +-2^30 goes
// through rot_sse2 (the int64 floor of Go's conversion).
static int rot_batch(const uint8_t *pix, ptrdiff_t stride, int64_t w, int64_t h, double cx, double cy, double cs,
	double sn, const double *offs, int k, int size, int j0, int j1, float *dst, float mul, float add) {
	int n = size * k;
	// ucs, usn: doubles; xi, yi: int32; fx, fy: floats; acc: 4 floats a pixel.
	size_t bytes = (size_t)n * (2 * sizeof(double) + 2 * sizeof(int32_t) + 2 * sizeof(float)) + (size_t)size * 4 * sizeof(float) + 64;
	double *ucs = malloc(bytes);
	if (ucs == NULL) {
		return 0;
	}
	double *usn = ucs + n;
	int32_t *xi = (int32_t *)(usn + n), *yi = xi + n;
	float *fxs = (float *)(yi + n), *fys = fxs + n, *acc = fys + n;
	for (int m = 0; m < n; m++) {
		ucs[m] = offs[m] * cs;
		usn[m] = offs[m] * sn;
	}
	const __m128i zero = _mm_setzero_si128();
	const __m128 vinv = _mm_set1_ps(1 / (float)(k * k)), vm = _mm_set1_ps(mul), va = _mm_set1_ps(add);
	const double lim = 1073741824.0;
	for (int j = j0; j < j1; j++) {
		for (int m = 0; m < 4 * size; m++) {
			acc[m] = 0;
		}
		for (int sj = 0; sj < k; sj++) {
			double v = offs[j * k + sj];
			double vsin = v * sn, vcos = v * cs;
			// Two coordinates a step: x = cx + u*cos - v*sin - 0.5 (u*cos
			// from ucs), floor by truncation and correction (exact below
			// 2^30), fraction as float32.
			const __m128d vcx = _mm_set1_pd(cx), vcy = _mm_set1_pd(cy), vs = _mm_set1_pd(vsin), vc = _mm_set1_pd(vcos);
			const __m128d half = _mm_set1_pd(0.5), one = _mm_set1_pd(1), vlim = _mm_set1_pd(lim), vnlim = _mm_set1_pd(-lim);
			int bad = 0, m = 0;
			for (; m + 2 <= n; m += 2) {
				__m128d x = _mm_sub_pd(_mm_sub_pd(_mm_add_pd(vcx, _mm_loadu_pd(ucs + m)), vs), half);
				__m128d y = _mm_sub_pd(_mm_add_pd(_mm_add_pd(vcy, _mm_loadu_pd(usn + m)), vc), half);
				__m128d ok = _mm_and_pd(_mm_and_pd(_mm_cmpgt_pd(x, vnlim), _mm_cmplt_pd(x, vlim)),
					_mm_and_pd(_mm_cmpgt_pd(y, vnlim), _mm_cmplt_pd(y, vlim)));
				bad |= _mm_movemask_pd(ok) ^ 3;
				__m128d tx = _mm_cvtepi32_pd(_mm_cvttpd_epi32(x)), ty = _mm_cvtepi32_pd(_mm_cvttpd_epi32(y));
				tx = _mm_sub_pd(tx, _mm_and_pd(_mm_cmpgt_pd(tx, x), one));
				ty = _mm_sub_pd(ty, _mm_and_pd(_mm_cmpgt_pd(ty, y), one));
				_mm_storel_epi64((__m128i *)(xi + m), _mm_cvttpd_epi32(tx));
				_mm_storel_epi64((__m128i *)(yi + m), _mm_cvttpd_epi32(ty));
				__m128 f = _mm_movelh_ps(_mm_cvtpd_ps(_mm_sub_pd(x, tx)), _mm_cvtpd_ps(_mm_sub_pd(y, ty)));
				float t[4];
				_mm_storeu_ps(t, f);
				fxs[m] = t[0];
				fxs[m + 1] = t[1];
				fys[m] = t[2];
				fys[m + 1] = t[3];
			}
			for (; m < n; m++) {
				double x = cx + ucs[m] - vsin - 0.5;
				double y = cy + usn[m] + vcos - 0.5;
				if (!(x > -lim && x < lim && y > -lim && y < lim)) {
					bad = 1;
					break;
				}
				int32_t a = (int32_t)x, b = (int32_t)y;
				a -= (double)a > x;
				b -= (double)b > y;
				xi[m] = a;
				yi[m] = b;
				fxs[m] = (float)(x - (double)a);
				fys[m] = (float)(y - (double)b);
			}
			if (bad) {
				free(ucs);
				return 0;
			}
			for (int i = 0; i < size; i++) {
				__m128 s = _mm_loadu_ps(acc + 4 * i);
				for (int si = 0; si < k; si++) {
					int m = i * k + si;
					int64_t x0 = xi[m], y0 = yi[m];
					__m128 fx = _mm_set1_ps(fxs[m]), fy = _mm_set1_ps(fys[m]);
					__m128 tl, tr, bl, br;
					if (x0 >= 0 && y0 >= 0 && x0 + 1 < w && y0 + 1 < h) {
						const uint8_t *p = pix + y0 * stride + 4 * x0;
						__m128i a = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)p), zero);
						__m128i b = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(p + stride)), zero);
						tl = _mm_cvtepi32_ps(_mm_unpacklo_epi16(a, zero));
						tr = _mm_cvtepi32_ps(_mm_unpackhi_epi16(a, zero));
						bl = _mm_cvtepi32_ps(_mm_unpacklo_epi16(b, zero));
						br = _mm_cvtepi32_ps(_mm_unpackhi_epi16(b, zero));
					} else {
						tl = im_px4(pix, stride, w, h, x0, y0);
						tr = im_px4(pix, stride, w, h, x0 + 1, y0);
						bl = im_px4(pix, stride, w, h, x0, y0 + 1);
						br = im_px4(pix, stride, w, h, x0 + 1, y0 + 1);
					}
					__m128 top = _mm_add_ps(tl, _mm_mul_ps(_mm_sub_ps(tr, tl), fx));
					__m128 bot = _mm_add_ps(bl, _mm_mul_ps(_mm_sub_ps(br, bl), fx));
					s = _mm_add_ps(s, _mm_add_ps(top, _mm_mul_ps(_mm_sub_ps(bot, top), fy)));
				}
				_mm_storeu_ps(acc + 4 * i, s);
			}
		}
		float *o = dst + (ptrdiff_t)j * size * 3;
		for (int i = 0; i < size; i++) {
			__m128 r = _mm_add_ps(_mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(acc + 4 * i), vinv), vm), va);
			if (i + 1 < size) {
				_mm_storeu_ps(o + 3 * i, r); // the fourth lane is the next pixel's, written next
			} else {
				float t[4];
				_mm_storeu_ps(t, r);
				o[3 * i] = t[0];
				o[3 * i + 1] = t[1];
				o[3 * i + 2] = t[2];
			}
		}
	}
	free(ucs);
	return 1;
}

// rot_avx2 is rot_plain eight output pixels at a time, one channel of
// eight samples per vector: lane l of a step is sub-sample (sj, si) of
// output pixel i0+l, so each pixel's sum still adds its samples in
// rot_plain's order. For each output row and sub-sample row, a first pass
// computes the coordinates as rot_plain does (u*cos and u*sin once per
// call; floor with _mm256_floor_pd, exact), a second reads the four
// neighbours (64-bit loads of two pixels; masked gathers, black outside,
// for vectors with a neighbour outside the image) and sums the bilinear
// samples. Returns 0 (nothing done) when some coordinate could leave
// +-2^30 or the image is too large for 32-bit offsets: the caller then
// takes rot_batch or rot_sse2.
__attribute__((target("avx2"))) static int rot_avx2(const uint8_t *pix, ptrdiff_t stride, int64_t w, int64_t h,
	double cx, double cy, double cs, double sn, const double *offs, int k, int size, int j0, int j1, float *dst,
	float mul, float add) {
	if (w <= 0 || h <= 0 || stride <= 0 || stride > 0x7fffffff / h - 8) {
		return 0;
	}
	// |x| <= |cx| + |u*cos| + |v*sin| + 0.5: all coordinates are within
	// +-2^30 when this bound is below 2^29 (NaN fails the tests).
	double lim = 536870912.0;
	if (!(fabs(cx) < lim && fabs(cy) < lim && fabs(cs) <= 1 && fabs(sn) <= 1)) {
		return 0;
	}
	double omax = 0;
	for (int m = 0; m < size * k; m++) {
		double a = fabs(offs[m]);
		if (!(a <= lim)) {
			return 0;
		}
		if (a > omax) {
			omax = a;
		}
	}
	if (!(fabs(cx) + fabs(cy) + 2 * omax + 1 < lim)) {
		return 0;
	}
	int np = (size + 7) & ~7; // pixels rounded up to whole vectors
	size_t kn = (size_t)k * np;
	// ucs[si*np + i] = offs[i*k + si] * cos (the last pixel's repeated up
	// to np), usn the same with sin; per sub-sample row: byte offsets q of
	// the top-left neighbours, xs and ys their column and row, fxs and fys
	// the fractions, bad[si*np/8 + b] whether vector b has a neighbour
	// outside the image; accr, accg, accb the sums of the current row.
	size_t bytes = kn * (2 * sizeof(double) + sizeof(int64_t) + 2 * sizeof(int32_t) + 2 * sizeof(float)) +
		(size_t)np * 3 * sizeof(float) + kn / 8 + 64;
	double *ucs = malloc(bytes);
	if (ucs == NULL) {
		return 0;
	}
	double *usn = ucs + kn;
	int64_t *q = (int64_t *)(usn + kn);
	int32_t *xs = (int32_t *)(q + kn), *ys = xs + kn;
	float *fxs = (float *)(ys + kn), *fys = fxs + kn, *accr = fys + kn, *accg = accr + np, *accb = accg + np;
	uint8_t *bad = (uint8_t *)(accb + np);
	for (int si = 0; si < k; si++) {
		for (int i = 0; i < np; i++) {
			double u = offs[(i < size ? i : size - 1) * k + si];
			ucs[si * np + i] = u * cs;
			usn[si * np + i] = u * sn;
		}
	}
	const __m256d vcx = _mm256_set1_pd(cx), vcy = _mm256_set1_pd(cy), half = _mm256_set1_pd(0.5);
	const __m256i vw = _mm256_set1_epi32((int32_t)w), vh = _mm256_set1_epi32((int32_t)h);
	const __m256i vw1 = _mm256_set1_epi32((int32_t)(w - 1)), vh1 = _mm256_set1_epi32((int32_t)(h - 1));
	const __m256i m1 = _mm256_set1_epi32(-1), m2 = _mm256_set1_epi32(-2), vstride = _mm256_set1_epi32((int32_t)stride);
	const __m256i four = _mm256_set1_epi32(4), z = _mm256_setzero_si256();
	// Byte shuffles taking channel c of each pixel as an int32.
#define IM_CHI(c, d) (int32_t)(0x80808000u | (c + d))
#define IM_CH(c) _mm256_setr_epi32(IM_CHI(c, 0), IM_CHI(c, 4), IM_CHI(c, 8), IM_CHI(c, 12), IM_CHI(c, 0), IM_CHI(c, 4), IM_CHI(c, 8), IM_CHI(c, 12))
	const __m256i chr = IM_CH(0), chg = IM_CH(1), chb = IM_CH(2);
#undef IM_CH
#undef IM_CHI
	const __m256 vinv = _mm256_set1_ps(1 / (float)(k * k)), vm = _mm256_set1_ps(mul), va = _mm256_set1_ps(add);
	const int *base = (const int *)pix;
	const uint8_t *pix1 = pix + stride;
	for (int j = j0; j < j1; j++) {
		for (int sj = 0; sj < k; sj++) {
			double v = offs[j * k + sj];
			const __m256d vs = _mm256_set1_pd(v * sn), vc = _mm256_set1_pd(v * cs);
			// Pass 1: coordinates x = cx + u*cos - v*sin - 0.5 and
			// y = cy + u*sin + v*cos - 0.5, as rot_plain, four at a time.
			for (size_t m = 0; m < kn; m += 4) {
				__m256d x = _mm256_sub_pd(_mm256_sub_pd(_mm256_add_pd(vcx, _mm256_loadu_pd(ucs + m)), vs), half);
				__m256d y = _mm256_sub_pd(_mm256_add_pd(_mm256_add_pd(vcy, _mm256_loadu_pd(usn + m)), vc), half);
				__m256d fx = _mm256_floor_pd(x), fy = _mm256_floor_pd(y);
				_mm_storeu_ps(fxs + m, _mm256_cvtpd_ps(_mm256_sub_pd(x, fx)));
				_mm_storeu_ps(fys + m, _mm256_cvtpd_ps(_mm256_sub_pd(y, fy)));
				__m128i xi = _mm256_cvttpd_epi32(fx), yi = _mm256_cvttpd_epi32(fy);
				_mm_storeu_si128((__m128i *)(xs + m), xi);
				_mm_storeu_si128((__m128i *)(ys + m), yi);
				_mm256_storeu_si256((__m256i *)(q + m), _mm256_add_epi64(_mm256_mul_epi32(_mm256_cvtepi32_epi64(yi), vstride),
					_mm256_slli_epi64(_mm256_cvtepi32_epi64(xi), 2)));
			}
			for (size_t m = 0; m < kn; m += 8) {
				// Some neighbour outside the image: x0 >= w-1 or y0 >= h-1
				// unsigned (negative ones are huge).
				__m256i x0 = _mm256_loadu_si256((const __m256i *)(xs + m)), y0 = _mm256_loadu_si256((const __m256i *)(ys + m));
				__m256i out = _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_max_epu32(x0, vw1), x0),
					_mm256_cmpeq_epi32(_mm256_max_epu32(y0, vh1), y0));
				bad[m / 8] = !_mm256_testz_si256(out, out);
			}
			// Pass 2: the bilinear samples, added to the row's sums.
			for (int i0 = 0; i0 < np; i0 += 8) {
				__m256 ar, ag, ab;
				if (sj == 0) {
					ar = _mm256_setzero_ps(), ag = ar, ab = ar;
				} else {
					ar = _mm256_loadu_ps(accr + i0), ag = _mm256_loadu_ps(accg + i0), ab = _mm256_loadu_ps(accb + i0);
				}
				for (int si = 0; si < k; si++) {
					size_t m = (size_t)si * np + i0;
					__m256 fx = _mm256_loadu_ps(fxs + m), fy = _mm256_loadu_ps(fys + m);
					__m256i tl, tr, bl, br;
					if (!bad[m / 8]) {
						// Left and right neighbour in one 64-bit read; t0 holds
						// samples 0, 1, 4, 5 and t1 2, 3, 6, 7, which the shuffles
						// put back in order.
						const int64_t *o = q + m;
#define IM_LD2(a, b) _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(a)), _mm_loadl_epi64((const __m128i *)(b)))
#define IM_LD4(p, a, b, c, d) _mm256_castsi256_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(IM_LD2(p + o[a], p + o[b])), IM_LD2(p + o[c], p + o[d]), 1))
						__m256 t0 = IM_LD4(pix, 0, 1, 4, 5), t1 = IM_LD4(pix, 2, 3, 6, 7);
						__m256 b0 = IM_LD4(pix1, 0, 1, 4, 5), b1 = IM_LD4(pix1, 2, 3, 6, 7);
#undef IM_LD4
#undef IM_LD2
						tl = _mm256_castps_si256(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(2, 0, 2, 0)));
						tr = _mm256_castps_si256(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 1, 3, 1)));
						bl = _mm256_castps_si256(_mm256_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)));
						br = _mm256_castps_si256(_mm256_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1)));
					} else {
						// Columns x0 and x0+1, rows y0 and y0+1 inside the image;
						// the masked gathers read black for the others.
						__m256i x0 = _mm256_loadu_si256((const __m256i *)(xs + m)), y0 = _mm256_loadu_si256((const __m256i *)(ys + m));
						__m256i cx0 = _mm256_and_si256(_mm256_cmpgt_epi32(x0, m1), _mm256_cmpgt_epi32(vw, x0));
						__m256i cx1 = _mm256_and_si256(_mm256_cmpgt_epi32(x0, m2), _mm256_cmpgt_epi32(vw1, x0));
						__m256i ry0 = _mm256_and_si256(_mm256_cmpgt_epi32(y0, m1), _mm256_cmpgt_epi32(vh, y0));
						__m256i ry1 = _mm256_and_si256(_mm256_cmpgt_epi32(y0, m2), _mm256_cmpgt_epi32(vh1, y0));
						__m256i off = _mm256_add_epi32(_mm256_mullo_epi32(y0, vstride), _mm256_slli_epi32(x0, 2));
						__m256i off1 = _mm256_add_epi32(off, vstride);
						tl = _mm256_mask_i32gather_epi32(z, base, off, _mm256_and_si256(cx0, ry0), 1);
						tr = _mm256_mask_i32gather_epi32(z, base, _mm256_add_epi32(off, four), _mm256_and_si256(cx1, ry0), 1);
						bl = _mm256_mask_i32gather_epi32(z, base, off1, _mm256_and_si256(cx0, ry1), 1);
						br = _mm256_mask_i32gather_epi32(z, base, _mm256_add_epi32(off1, four), _mm256_and_si256(cx1, ry1), 1);
					}
#define IM_ROT_CH(acc, sh)                                                                                              \
	do {                                                                                                                \
		__m256 a = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(tl, sh));                                                    \
		__m256 b = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(tr, sh));                                                    \
		__m256 c = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(bl, sh));                                                    \
		__m256 d = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(br, sh));                                                    \
		__m256 top = _mm256_add_ps(a, _mm256_mul_ps(_mm256_sub_ps(b, a), fx));                                         \
		__m256 bot = _mm256_add_ps(c, _mm256_mul_ps(_mm256_sub_ps(d, c), fx));                                         \
		acc = _mm256_add_ps(acc, _mm256_add_ps(top, _mm256_mul_ps(_mm256_sub_ps(bot, top), fy)));                      \
	} while (0)
					IM_ROT_CH(ar, chr);
					IM_ROT_CH(ag, chg);
					IM_ROT_CH(ab, chb);
#undef IM_ROT_CH
				}
				_mm256_storeu_ps(accr + i0, ar);
				_mm256_storeu_ps(accg + i0, ag);
				_mm256_storeu_ps(accb + i0, ab);
			}
		}
		// The row's output pixels: sum * (1/k^2) * mul + add.
		float *o = dst + (ptrdiff_t)j * size * 3;
		for (int i0 = 0; i0 < size; i0 += 8) {
			float t[24];
			_mm256_storeu_ps(t, _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(accr + i0), vinv), vm), va));
			_mm256_storeu_ps(t + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(accg + i0), vinv), vm), va));
			_mm256_storeu_ps(t + 16, _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(accb + i0), vinv), vm), va));
			int e = size - i0 < 8 ? size - i0 : 8;
			for (int l = 0; l < e; l++) {
				o[3 * (i0 + l)] = t[l];
				o[3 * (i0 + l) + 1] = t[8 + l];
				o[3 * (i0 + l) + 2] = t[16 + l];
			}
		}
	}
	free(ucs);
	return 1;
}
#endif

void im_rotated_rows(const uint8_t *pix, ptrdiff_t stride, int64_t w, int64_t h, double cx, double cy, double cs,
	double sn, const double *offs, int k, int size, int j0, int j1, float *dst, float mul, float add, int level) {
#if IM_X86
	int lv = im_level(level);
	if (lv >= 2 && rot_avx2(pix, stride, w, h, cx, cy, cs, sn, offs, k, size, j0, j1, dst, mul, add)) {
		return;
	}
	if (lv >= 1) {
		if (rot_batch(pix, stride, w, h, cx, cy, cs, sn, offs, k, size, j0, j1, dst, mul, add)) {
			return;
		}
		rot_sse2(pix, stride, w, h, cx, cy, cs, sn, offs, k, size, j0, j1, dst, mul, add);
		return;
	}
#endif
	(void)level;
	rot_plain(pix, stride, w, h, cx, cy, cs, sn, offs, k, size, j0, j1, dst, mul, add);
}

// ---- Threshold scan ---------------------------------------------------

int im_scan_above(const float *v, int i0, int i1, float thr, int32_t *out, int cap, int *next) {
	int n = 0, i = i0;
#if IM_X86
	const __m128 t = _mm_set1_ps(thr);
	for (; i + 4 <= i1; i += 4) {
		// Not below thr (NaN included, as Go's `v < thr` test lets it by).
		int mask = _mm_movemask_ps(_mm_cmpnlt_ps(_mm_loadu_ps(v + i), t));
		if (mask == 0) {
			continue;
		}
		if (n + 4 > cap) {
			break;
		}
		for (int b = 0; b < 4; b++) {
			if (mask & (1 << b)) {
				out[n++] = i + b;
			}
		}
	}
#endif
	for (; i < i1; i++) {
		if (!(v[i] < thr)) {
			if (n == cap) {
				break;
			}
			out[n++] = i;
		}
	}
	*next = i;
	return n;
}
