/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/nvjpeg_roundtrip.c - nvJPEG under libemm (issue 18, item 1):
 * encode a synthetic image, decode it with the simple, decoupled, batched
 * and hardware APIs, and check both the pictures and libemm's books.
 *
 * nvJPEG's hardware path (and, on some drivers, the batched one) loads the
 * driver's libnvcuvid, which gets device buffers from the driver through
 * its private tables (libemm cannot serve those) and frees them with the
 * public cuMemFree_v2, libemm's shim. libemm must count those frees under
 * "passed by, driver components" with their sizes, and none as an unknown
 * free (before, every run had 2 to 16 unknown frees, all from libnvcuvid).
 *
 * Pictures: JPEG is lossy, so each decode is compared with the image that
 * was encoded (PSNR above 30 dB for a smooth image at quality 90), with the
 * simple API's decode (PSNR above 30 dB: the backends may round apart),
 * and with itself (three decodes into three buffers, bit-identical: a
 * buffer libemm handed out twice would show here). A checksum of each is
 * printed.
 *
 * Exits 77 without a GPU. Built only where the toolkit has nvjpeg.h and
 * libnvjpeg (tests/gpu/meson.build).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <nvjpeg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"

enum { W = 640, H = 480, BYTES = W * H * 3, BATCH = 4, REPEATS = 3 };

/* A failed CUDA or nvJPEG call fails the test and leaves it. */
#define CK(x)                                                                                                \
	do {                                                                                                 \
		int e_ = (int)(x);                                                                           \
		if (e_ != 0) {                                                                               \
			emm_test_fail_("%s -> %d", #x, e_);                                                  \
			return;                                                                              \
		}                                                                                            \
	} while (0)

static unsigned char *original; /* the encoded picture, interleaved RGB */
static unsigned char *jpg;      /* its JPEG bitstream */
static size_t jpg_len;
static unsigned char *reference; /* the simple API's decode */
static cudaStream_t stream;
static struct emm_stats at_start;

/* nvjpegCreateEx's allocators: the runtime's, as an application's would be
 * (libemm serves them). */
static int dev_malloc(void **p, size_t n)
{
	return (int)cudaMalloc(p, n);
}

static int dev_free(void *p)
{
	return (int)cudaFree(p);
}

static int pinned_malloc(void **p, size_t n, unsigned int flags)
{
	return (int)cudaHostAlloc(p, n, flags);
}

static int pinned_free(void *p)
{
	return (int)cudaFreeHost(p);
}

static void make_original(void)
{
	original = malloc(BYTES);
	if (!original) {
		fprintf(stderr, "out of host memory\n");
		exit(1);
	}
	/* smooth: gradients and a slow wave, which JPEG keeps well */
	for (int y = 0; y < H; y++)
		for (int x = 0; x < W; x++) {
			unsigned char *px = original + ((size_t)y * W + (size_t)x) * 3;

			px[0] = (unsigned char)(x * 255 / (W - 1));
			px[1] = (unsigned char)(y * 255 / (H - 1));
			px[2] = (unsigned char)(128 + 100 * sin((x + y) / 40.0));
		}
}

static double psnr(const unsigned char *a, const unsigned char *b)
{
	double se = 0;

	for (size_t i = 0; i < BYTES; i++) {
		double d = (double)a[i] - (double)b[i];
		se += d * d;
	}
	if (se == 0)
		return INFINITY;
	return 10 * log10(255.0 * 255.0 / (se / BYTES));
}

static uint64_t checksum(const unsigned char *p)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < BYTES; i++)
		sum = sum * 31 + p[i];
	return sum;
}

static int image_alloc(nvjpegImage_t *img)
{
	memset(img, 0, sizeof(*img));
	img->pitch[0] = W * 3;
	return (int)cudaMalloc((void **)&img->channel[0], BYTES);
}

/* Copy a decode back, check it against the original, the reference and
 * (when `first` is given) the first decode of the same API, bit for bit.
 * Returns the host copy (the caller frees it), NULL on a copy failure. */
static unsigned char *check_decode(const char *what, int k, nvjpegImage_t *img, const unsigned char *first)
{
	unsigned char *host = malloc(BYTES);
	double p_orig, p_ref;

	if (!host || cudaMemcpy(host, img->channel[0], BYTES, cudaMemcpyDeviceToHost) != cudaSuccess) {
		emm_test_fail_("%s #%d: copying the decode back failed", what, k);
		free(host);
		return NULL;
	}
	p_orig = psnr(original, host);
	p_ref = reference ? psnr(reference, host) : INFINITY;
	printf("  %-10s #%d: checksum %016llx, PSNR %.1f dB against the original, %.1f dB against simple\n", what, k,
	       (unsigned long long)checksum(host), p_orig, p_ref);
	if (p_orig < 30)
		emm_test_fail_("%s #%d: PSNR %.1f dB against the original (a wrong picture)", what, k, p_orig);
	if (p_ref < 30)
		emm_test_fail_("%s #%d: PSNR %.1f dB against the simple API's decode", what, k, p_ref);
	if (first && memcmp(first, host, BYTES) != 0)
		emm_test_fail_("%s #%d differs from #0 of the same API (PSNR %.1f dB): the same input must decode "
		               "the same",
		               what, k, psnr(first, host));
	return host;
}

TEST_BEGIN(test_encode)
{
	nvjpegHandle_t h;
	nvjpegEncoderState_t st;
	nvjpegEncoderParams_t params;
	nvjpegImage_t img;
	nvjpegDevAllocator_t da = {dev_malloc, dev_free};
	nvjpegPinnedAllocator_t pa = {pinned_malloc, pinned_free};

	assert_emm_present();
	make_original();
	CK(nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, &da, &pa, NVJPEG_FLAGS_DEFAULT, &h));
	CK(image_alloc(&img));
	CK(cudaMemcpy(img.channel[0], original, BYTES, cudaMemcpyHostToDevice));
	CK(nvjpegEncoderStateCreate(h, &st, stream));
	CK(nvjpegEncoderParamsCreate(h, &params, stream));
	CK(nvjpegEncoderParamsSetSamplingFactors(params, NVJPEG_CSS_420, stream));
	CK(nvjpegEncoderParamsSetQuality(params, 90, stream));
	CK(nvjpegEncodeImage(h, st, params, &img, NVJPEG_INPUT_RGBI, W, H, stream));
	CK(nvjpegEncodeRetrieveBitstream(h, st, NULL, &jpg_len, stream));
	jpg = malloc(jpg_len);
	assert_true(jpg != NULL);
	CK(nvjpegEncodeRetrieveBitstream(h, st, jpg, &jpg_len, stream));
	CK(cudaStreamSynchronize(stream));
	printf("  encoded %dx%d into %zu bytes\n", W, H, jpg_len);
	expect_true(jpg_len > 1000 && jpg_len < BYTES);
	CK(nvjpegEncoderParamsDestroy(params));
	CK(nvjpegEncoderStateDestroy(st));
	CK(cudaFree(img.channel[0]));
	CK(nvjpegDestroy(h));
}
TEST_END

TEST_BEGIN(test_simple)
{
	nvjpegHandle_t h;
	nvjpegJpegState_t st;
	nvjpegImage_t out[REPEATS];
	unsigned char *first = NULL;

	assert_true(jpg != NULL);
	CK(nvjpegCreateSimple(&h));
	CK(nvjpegJpegStateCreate(h, &st));
	for (int k = 0; k < REPEATS; k++)
		CK(image_alloc(&out[k]));
	for (int k = 0; k < REPEATS; k++)
		CK(nvjpegDecode(h, st, jpg, jpg_len, NVJPEG_OUTPUT_RGBI, &out[k], stream));
	CK(cudaStreamSynchronize(stream));
	for (int k = 0; k < REPEATS; k++) {
		unsigned char *host = check_decode("simple", k, &out[k], first);

		if (k == 0)
			first = host;
		else
			free(host);
		CK(cudaFree(out[k].channel[0]));
	}
	reference = first;
	CK(nvjpegJpegStateDestroy(st));
	CK(nvjpegDestroy(h));
}
TEST_END

TEST_BEGIN(test_decoupled)
{
	nvjpegDevAllocator_t da = {dev_malloc, dev_free};
	nvjpegPinnedAllocator_t pa = {pinned_malloc, pinned_free};
	nvjpegHandle_t h;
	nvjpegJpegDecoder_t dec;
	nvjpegJpegState_t ds;
	nvjpegBufferPinned_t pb;
	nvjpegBufferDevice_t db;
	nvjpegJpegStream_t js;
	nvjpegDecodeParams_t dp;
	nvjpegImage_t out[REPEATS];
	unsigned char *first = NULL;

	assert_true(jpg != NULL);
	CK(nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, &da, &pa, NVJPEG_FLAGS_DEFAULT, &h));
	CK(nvjpegDecoderCreate(h, NVJPEG_BACKEND_DEFAULT, &dec));
	CK(nvjpegDecoderStateCreate(h, dec, &ds));
	CK(nvjpegBufferPinnedCreate(h, NULL, &pb));
	CK(nvjpegBufferDeviceCreate(h, NULL, &db));
	CK(nvjpegJpegStreamCreate(h, &js));
	CK(nvjpegDecodeParamsCreate(h, &dp));
	CK(nvjpegStateAttachPinnedBuffer(ds, pb));
	CK(nvjpegStateAttachDeviceBuffer(ds, db));
	CK(nvjpegDecodeParamsSetOutputFormat(dp, NVJPEG_OUTPUT_RGBI));
	for (int k = 0; k < REPEATS; k++)
		CK(image_alloc(&out[k]));
	for (int k = 0; k < REPEATS; k++) {
		CK(nvjpegJpegStreamParse(h, jpg, jpg_len, 0, 0, js));
		CK(nvjpegDecodeJpegHost(h, dec, ds, dp, js));
		CK(nvjpegDecodeJpegTransferToDevice(h, dec, ds, js, stream));
		CK(nvjpegDecodeJpegDevice(h, dec, ds, &out[k], stream));
	}
	CK(cudaStreamSynchronize(stream));
	for (int k = 0; k < REPEATS; k++) {
		unsigned char *host = check_decode("decoupled", k, &out[k], first);

		if (k == 0)
			first = host;
		else
			free(host);
		CK(cudaFree(out[k].channel[0]));
	}
	free(first);
	CK(nvjpegDecodeParamsDestroy(dp));
	CK(nvjpegJpegStreamDestroy(js));
	CK(nvjpegJpegStateDestroy(ds));
	CK(nvjpegBufferPinnedDestroy(pb));
	CK(nvjpegBufferDeviceDestroy(db));
	CK(nvjpegDecoderDestroy(dec));
	CK(nvjpegDestroy(h));
}
TEST_END

/* nvjpegDecodeBatched on `backend`: BATCH copies of the picture, REPEATS
 * times into the same outputs; every output checked, the first batch's
 * first as the reference of the rest. Skipped when the backend cannot be
 * created here (no hardware decoder). */
static void batched(const char *what, nvjpegBackend_t backend)
{
	const unsigned char *data[BATCH];
	size_t lengths[BATCH];
	nvjpegImage_t out[BATCH];
	nvjpegHandle_t h;
	nvjpegJpegState_t st;
	unsigned char *first = NULL;
	int e;

	assert_true(jpg != NULL);
	e = nvjpegCreateEx(backend, NULL, NULL, NVJPEG_FLAGS_DEFAULT, &h);
	if (e != NVJPEG_STATUS_SUCCESS) {
		char why[96];

		snprintf(why, sizeof(why), "nvjpegCreateEx(%s backend) -> %d here", what, e);
		emm_test_skip(why);
		return;
	}
	for (int i = 0; i < BATCH; i++) {
		data[i] = jpg;
		lengths[i] = jpg_len;
		CK(image_alloc(&out[i]));
	}
	CK(nvjpegJpegStateCreate(h, &st));
	CK(nvjpegDecodeBatchedInitialize(h, st, BATCH, 1, NVJPEG_OUTPUT_RGBI));
	for (int k = 0; k < REPEATS; k++) {
		CK(nvjpegDecodeBatched(h, st, data, lengths, out, stream));
		CK(cudaStreamSynchronize(stream));
		for (int i = 0; i < BATCH; i++) {
			unsigned char *host = check_decode(what, k * BATCH + i, &out[i], first);

			if (!first)
				first = host;
			else
				free(host);
		}
		for (int i = 0; i < BATCH; i++)
			CK(cudaMemset(out[i].channel[0], 0, BYTES));
	}
	free(first);
	for (int i = 0; i < BATCH; i++)
		CK(cudaFree(out[i].channel[0]));
	CK(nvjpegJpegStateDestroy(st));
	CK(nvjpegDestroy(h));
}

TEST_BEGIN(test_batched)
{
	batched("batched", NVJPEG_BACKEND_DEFAULT);
}
TEST_END

static int hardware_ran;

TEST_BEGIN(test_hardware)
{
	batched("hardware", NVJPEG_BACKEND_HARDWARE);
	hardware_ran = !emm_test_current.skipped && !emm_test_current.failures;
}
TEST_END

/* libemm's books over the whole run: no unknown free; the hardware path's
 * buffers counted as a driver component's, with bytes; libemm served the
 * runtime allocations. */
TEST_BEGIN(test_accounting)
{
	struct emm_stats now;
	unsigned long long unknown, driver, driver_bytes, allocs;

	assert_emm_present();
	CK(cudaDeviceSynchronize());
	assert_int_eq(gpu_stats(GPU_SCOPE_PROCESS, &now), 0);
	expect_true(now.version >= 5);
	unknown = now.passby_unknown_free_calls - at_start.passby_unknown_free_calls;
	driver = now.passby_driver_calls - at_start.passby_driver_calls;
	driver_bytes = now.passby_driver_bytes - at_start.passby_driver_bytes;
	allocs = now.allocs - at_start.allocs;
	printf("  libemm: %llu allocations served; passed by: %llu frees of driver components' memory (%llu bytes), "
	       "%llu unknown frees\n",
	       allocs, driver, driver_bytes, unknown);
	expect_int_eq(unknown, 0);
	expect_true(allocs > 0);
	if (hardware_ran) {
		expect_true(driver > 0);
		expect_true(driver_bytes >= driver);
	} else if (driver == 0) {
		emm_test_skip("the hardware decoder did not run here: no driver component's free to count");
	}
}
TEST_END

int main(void)
{
	int n = 0, rc;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		printf("no CUDA device: skipped\n");
		return GPU_SKIP;
	}
	(void)gpu_stats(GPU_SCOPE_PROCESS, &at_start);
	if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
		fprintf(stderr, "cudaStreamCreateWithFlags failed\n");
		return 1;
	}
	rc = emm_test_run(test_encode, test_simple, test_decoupled, test_batched, test_hardware, test_accounting,
	                  NULL);
	cudaStreamDestroy(stream);
	free(reference);
	free(jpg);
	free(original);
	gpu_print_served("nvjpeg-roundtrip");
	return rc;
}
