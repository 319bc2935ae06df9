//go:build cgo && !nolibjpeg

package imagecodec

/*
#cgo LDFLAGS: -l:libjpeg.a
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <jpeglib.h>

// imErr is libjpeg's error manager plus the jump target error_exit uses
// instead of exit(), and a count of the warnings (corrupt data) seen.
typedef struct {
	struct jpeg_error_mgr pub;
	jmp_buf jump;
	int warnings;
} imErr;

static void imErrorExit(j_common_ptr c) {
	longjmp(((imErr *)c->err)->jump, 1);
}

static void imEmit(j_common_ptr c, int level) {
	if (level < 0) {
		((imErr *)c->err)->warnings++;
	}
}

// imDecode decodes the JPEG data[0:n] of w x h pixels into dst as RGBA
// rows of stride bytes (alpha 255), chroma replicated as Go's image/jpeg
// does (no fancy upsampling) and the accurate integer IDCT. It returns 0
// on success and 1 on anything else: an error, a warning (corrupt or
// truncated data), other dimensions, a colour space without an RGBA
// conversion (CMYK, YCCK) or more than maxMem bytes of working memory.
// With progress not NULL, the number of rows written so far is stored
// there (release order) after each batch of rows, for a reader on
// another thread, and at the end h on success or -1 on anything else.
static int imDecodeRows(const unsigned char *data, unsigned long n, unsigned char *dst, int stride, int w, int h, long maxMem, int32_t *progress);

static int imDecode(const unsigned char *data, unsigned long n, unsigned char *dst, int stride, int w, int h, long maxMem, int32_t *progress) {
	int r = imDecodeRows(data, n, dst, stride, w, h, maxMem, progress);
	if (progress != NULL) {
		__atomic_store_n(progress, r == 0 ? (int32_t)h : -1, __ATOMIC_RELEASE);
	}
	return r;
}

static int imDecodeRows(const unsigned char *data, unsigned long n, unsigned char *dst, int stride, int w, int h, long maxMem, int32_t *progress) {
	struct jpeg_decompress_struct d;
	imErr e;
	JSAMPROW rows[16];
	d.err = jpeg_std_error(&e.pub);
	e.pub.error_exit = imErrorExit;
	e.pub.emit_message = imEmit;
	e.warnings = 0;
	if (setjmp(e.jump)) {
		jpeg_destroy_decompress(&d);
		return 1;
	}
	jpeg_create_decompress(&d);
	d.mem->max_memory_to_use = maxMem;
	jpeg_mem_src(&d, data, n);
	if (jpeg_read_header(&d, TRUE) != JPEG_HEADER_OK || (int)d.image_width != w || (int)d.image_height != h ||
		(d.jpeg_color_space != JCS_YCbCr && d.jpeg_color_space != JCS_GRAYSCALE) || e.warnings) {
		jpeg_destroy_decompress(&d);
		return 1;
	}
	d.out_color_space = JCS_EXT_RGBA;
	d.do_fancy_upsampling = FALSE;
	d.dct_method = JDCT_ISLOW;
	jpeg_start_decompress(&d);
	while (d.output_scanline < d.output_height && !e.warnings) {
		int k = 0;
		for (; k < 16 && d.output_scanline + k < d.output_height; k++) {
			rows[k] = dst + (size_t)(d.output_scanline + k) * stride;
		}
		if (jpeg_read_scanlines(&d, rows, k) == 0) {
			break;
		}
		if (progress != NULL && !e.warnings && d.output_scanline < d.output_height) {
			__atomic_store_n(progress, (int32_t)d.output_scanline, __ATOMIC_RELEASE);
		}
	}
	if (d.output_scanline < d.output_height || e.warnings) {
		jpeg_destroy_decompress(&d);
		return 1;
	}
	jpeg_finish_decompress(&d);
	jpeg_destroy_decompress(&d);
	return e.warnings ? 1 : 0;
}

static void imYield(void) { sched_yield(); }
*/
import "C"

import (
	"image"
	"unsafe"
)

// turboAvailable reports whether decodeJPEGTurbo can decode: in cgo builds
// without the nolibjpeg tag. libjpeg-turbo is linked statically (Debian's
// libjpeg62-turbo-dev at build time), so the binary needs no libjpeg at run
// time.
const turboAvailable = true

// decodeJPEGTurbo decodes a w x h JPEG with libjpeg-turbo straight into an
// RGBA image over pix (w*h*4 bytes, any contents), about three times
// faster than image/jpeg plus the YCbCr to RGBA conversion every pipeline
// needs. It reports false for anything it does not decode cleanly (errors,
// corrupt or truncated data, CMYK), for which the caller uses image/jpeg,
// so which files are accepted and which errors are reported stay
// image/jpeg's. With progress not nil, the number of rows decoded so far
// is stored there (atomically) as they are written, and at the end h on
// success or -1 when it reports false.
func decodeJPEGTurbo(data []byte, w, h int, pix []byte, progress *int32) (*image.RGBA, bool) {
	if len(data) == 0 || w <= 0 || h <= 0 || len(pix) != w*h*4 {
		return nil, false
	}
	img := &image.RGBA{Pix: pix, Stride: 4 * w, Rect: image.Rect(0, 0, w, h)}
	// Working memory beyond the pixels (a progressive file's coefficients:
	// at most 2 bytes x 3 components per pixel, plus row buffers) stays
	// within the part of Cost that the RGBA copy the pipelines no longer
	// make would have used.
	maxMem := C.long(int64(w)*int64(h)*8 + 1<<20)
	ok := C.imDecode((*C.uchar)(unsafe.Pointer(&data[0])), C.ulong(len(data)),
		(*C.uchar)(unsafe.Pointer(&img.Pix[0])), C.int(img.Stride), C.int(w), C.int(h), maxMem,
		(*C.int32_t)(unsafe.Pointer(progress))) == 0
	if !ok {
		return nil, false
	}
	return img, true
}

// osYield gives the thread's CPU to another runnable thread, if any: a
// reader spinning on a stream's rows on the decoding thread's CPU lets the
// decoder run instead of taking half its time.
func osYield() { C.imYield() }
