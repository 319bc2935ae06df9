// Declarations of the C pixel kernels (pixels.c), used by pixels_cgo.go.
#include <stddef.h>
#include <stdint.h>

// im_simd_level is the best vector level of this CPU: 0 plain C, 1 SSE2,
// 2 AVX2. The kernels take a level; a negative one means the best.
int im_simd_level(void);

void im_resample_band(const uint8_t *pix, ptrdiff_t stride, int cx0, int cx1,
	const int32_t *xfirst, const int32_t *xcount, const float *xw, int xn, int dw,
	const int32_t *yfirst, const int32_t *ycount, const float *yw, int yn,
	int j0, int j1, float mul, float add, float *dst, float *vrow, int level);

void im_rotated_rows(const uint8_t *pix, ptrdiff_t stride, int64_t w, int64_t h, double cx, double cy, double cs,
	double sn, const double *offs, int k, int size, int j0, int j1, float *dst, float mul, float add, int level);

// im_scan_above writes the indices i in [i0, i1) whose v[i] is not below
// thr, in increasing order, into out (at most cap of them, cap >= 4), sets
// *next to where the scan stopped (i1 when done) and returns their count.
int im_scan_above(const float *v, int i0, int i1, float thr, int32_t *out, int cap, int *next);
