/* SPDX-License-Identifier: MIT */
/*
 * interpose/resolve.c - owns the resolvers: every way a program turns a
 * driver function's name into a pointer reaches libemm through here.
 *
 *   dlsym                       (cudart's bootstrap, PyTorch, ctypes)
 *   cuGetProcAddress, _v2       (cudart, cuda-python, Numba, CuPy)
 *   cudaGetDriverEntryPoint{,ByVersion}{,_ptsz}   (shared-cudart callers)
 *
 * One rule for all of them: call the real resolver first, and substitute
 * libemm's shim only for the exact exported function it returned (its name
 * from dladdr, or for dlsym the name asked for). The driver picks the ABI
 * (cudaVersion, _v2/_v3, _ptsz for per-thread streams) and libemm never
 * invents a pointer, so an ABI we have no shim for is returned untouched.
 * Lookups made from inside the driver (libcuda.so*, libnvidia-*) or from
 * libemm and its backends are never substituted, so the driver and the
 * allocator always reach the real functions.
 *
 * dlsym must stay transparent: glibc resolves RTLD_NEXT, and RTLD_DEFAULT
 * for a library opened with RTLD_LOCAL, relative to the return address of
 * the dlsym call. Those two handles are therefore forwarded by a jump
 * (an assembly trampoline on x86-64 and aarch64), so glibc sees the original
 * caller; that path allocates nothing, takes no lock and logs nothing.
 *
 * Symbol versions: libemm exports one unversioned `dlsym`. glibc's
 * check_match accepts an unversioned definition for a versioned reference
 * (a non-hidden reference, which every link-time reference is), so
 * references to dlsym@GLIBC_2.34 (programs built on glibc >= 2.34) and to
 * dlsym@GLIBC_2.2.5 (older builds: manylinux wheels, libcudart_static users
 * linked on old systems) both bind to it. Verified with LD_DEBUG=bindings on
 * glibc 2.36 (build machine) and 2.39 (the H200 machine) by
 * tests/interpose/test-dlsym-versions, which references both versions;
 * nvshare's .symver pair is therefore not needed, and it would need a
 * version script defining GLIBC_* nodes in libemm. A lookup that
 * asks for a version itself (dlvsym) is not intercepted: cudart uses dlvsym
 * only for libc functions.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "common/compiler.h"
#include "common/log.h"
#include "process/process.h"
#include "interpose/shims.h"

/* cuda.h maps cuGetProcAddress to the _v2 ABI; the bare name is the
 * 4-argument export, declared here under its real name. */
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

/* Per-thread-default-stream entry points of shared cudart, which its header
 * declares only under --default-stream per-thread. */
cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                  unsigned int cudaVersion, unsigned long long flags,
                                                  enum cudaDriverEntryPointQueryResult *driverStatus);

/* Reached from the dlsym trampoline by a jump, so its return address is the
 * caller of dlsym. */
void *emm_dlsym_explicit(void *handle, const char *name);

/* --- when to substitute --------------------------------------------------- */

/*
 * emm_state_enabled() initialises libemm on first use (options, backend).
 * A lookup made on this thread while that runs (a constructor of something
 * the initialisation opens) must not re-enter it: it gets the real
 * function. Initial-exec TLS: no allocation on first access.
 */
static __thread bool tls_in_enable __attribute__((tls_model("initial-exec")));

static bool enabled_for_substitution(void)
{
	bool on;

	if (tls_in_enable)
		return false;
	tls_in_enable = true;
	on = emm_state_enabled();
	tls_in_enable = false;
	return on;
}

static void *shim_for_name(const char *exported_name)
{
	void *shim = emm_shim_for(exported_name);

	return shim ? shim : emm_resolver_shim_for(exported_name);
}

/* Lookups from the driver itself (HAMi-core PR #326: the driver asked for
 * cuInit, got the hook, recursed) or from libemm and its backends (they
 * need the real functions) get what they asked for. */
static bool caller_is_exempt(const void *caller)
{
	return emm_real_is_driver_address(caller) || emm_real_is_libemm_address(caller);
}

/*
 * What a resolver hands back for `fn`, the pointer the real resolver
 * returned: libemm's shim for the exact export at `fn`, or `fn` itself.
 */
static void *substitute_exported(void *fn, const void *caller)
{
	Dl_info info;
	void *shim;

	if (!dladdr(fn, &info) || info.dli_saddr != fn || !info.dli_sname)
		return fn;
	shim = shim_for_name(info.dli_sname);
	if (!shim || shim == fn || caller_is_exempt(caller) || !enabled_for_substitution())
		return fn;
	return shim;
}

/*
 * EMM_VERBOSE=2: one line per name a program resolved through a driver
 * resolver, with the library that asked, the export the driver answered
 * with and whether libemm substituted its shim - how to find the path by
 * which a library's allocations go past libemm (a name with no shim, or an
 * answer that is not an exact export). dladdr allocates nothing.
 */
static const char *library_of(const void *addr)
{
	Dl_info info;

	return dladdr(addr, &info) && info.dli_fname ? info.dli_fname : "?";
}

static void *resolved(const char *via, const char *symbol, int version, void *fn, const void *caller)
{
	void *out = substitute_exported(fn, caller);
	Dl_info what;

	if (!emm_log_debug_enabled())
		return out;
	if (!dladdr(fn, &what) || !what.dli_sname || what.dli_saddr != fn)
		what.dli_sname = NULL;
	emm_debug("resolve: %s(\"%s\", %d) from %s: %s%s", via, symbol ? symbol : "(null)", version,
	          library_of(caller), what.dli_sname ? what.dli_sname : "not an exported function",
	          out != fn ? " -> libemm's shim" : "");
	return out;
}

/* --- dlsym ------------------------------------------------------------------ */

/*
 * An explicit handle: the lookup does not depend on the caller, so the real
 * dlsym may be called normally and its result examined. Substitute only a
 * result that is libcuda's export and has a shim, for a caller outside the
 * driver and libemm, when libemm is enabled - cheapest test first.
 */
static void *dlsym_choose(void *fn, const char *name, const void *caller)
{
	void *shim = shim_for_name(name);

	if (!shim || shim == fn)
		return fn;
	/* The driver's own export (a cached lookup), not a symbol of another
	 * library or of a libcuda copy in a dlmopen namespace. */
	if (!emm_real_is_driver_export(fn, name))
		return fn;
	if (caller_is_exempt(caller) || !enabled_for_substitution())
		return fn;
	return shim;
}

static void *dlsym_explicit(void *handle, const char *name, const void *caller)
{
	void *fn = emm_real_dlsym_get()(handle, name);
	void *out;

	/* Every driver export starts with "cu". */
	if (!fn || name[0] != 'c' || name[1] != 'u')
		return fn;
	/* dlsym found the export called `name`; that is its exact name. */
	out = dlsym_choose(fn, name, caller);
	if (EMM_UNLIKELY(emm_log_debug_enabled()) && !caller_is_exempt(caller))
		emm_debug("resolve: dlsym(\"%s\") from %s%s", name, library_of(caller),
		          out != fn ? " -> libemm's shim" : "");
	return out;
}

#if defined(__x86_64__)

/* `used`: the trampoline below jumps here from asm, which link-time
 * optimisation does not see. */
__attribute__((used)) void *emm_dlsym_explicit(void *handle, const char *name)
{
	return dlsym_explicit(handle, name, __builtin_return_address(0));
}

/*
 * RTLD_DEFAULT (0) and RTLD_NEXT (-1) jump to glibc's dlsym with the
 * caller's return address still on top of the stack. Before the real dlsym
 * is known (first call), the arguments are saved around one call that finds
 * it, the stack restored, and the jump made as usual. Other handles jump to
 * emm_dlsym_explicit. endbr64 is a no-op on CPUs without CET.
 */
/* clang-format off */
__asm__(".pushsection .text\n"
	"	.globl	dlsym\n"
	"	.type	dlsym, @function\n"
	"	.p2align 4\n"
	"dlsym:\n"
	"	.cfi_startproc\n"
	"	endbr64\n"
	"	testq	%rdi, %rdi\n"
	"	je	1f\n"
	"	cmpq	$-1, %rdi\n"
	"	je	1f\n"
	"	jmp	emm_dlsym_explicit\n"
	"1:	movq	emm_real_dlsym_ptr(%rip), %rax\n"
	"	testq	%rax, %rax\n"
	"	je	2f\n"
	"	jmp	*%rax\n"
	"2:	pushq	%rdi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	pushq	%rsi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	subq	$8, %rsp\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	call	emm_real_dlsym_get\n"
	"	addq	$8, %rsp\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	popq	%rsi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	popq	%rdi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	jmp	*%rax\n"
	"	.cfi_endproc\n"
	"	.size	dlsym, .-dlsym\n"
	".popsection\n");
/* clang-format on */

#elif defined(__aarch64__)

/* `used`: the trampoline below jumps here from asm, which link-time
 * optimisation does not see. */
__attribute__((used)) void *emm_dlsym_explicit(void *handle, const char *name)
{
	return dlsym_explicit(handle, name, __builtin_return_address(0));
}

/* The same on aarch64: the caller's return address is x30, left alone on
 * the forwarding paths (saved and restored around the first-call lookup).
 * bti c (hint 34) is a no-op without BTI. */
/* clang-format off */
__asm__(".pushsection .text\n"
	"	.globl	dlsym\n"
	"	.type	dlsym, %function\n"
	"	.p2align 4\n"
	"dlsym:\n"
	"	.cfi_startproc\n"
	"	hint	34\n"
	"	cbz	x0, 1f\n"
	"	cmn	x0, #1\n"
	"	b.eq	1f\n"
	"	b	emm_dlsym_explicit\n"
	"1:	adrp	x16, emm_real_dlsym_ptr\n"
	"	ldr	x16, [x16, :lo12:emm_real_dlsym_ptr]\n"
	"	cbz	x16, 2f\n"
	"	br	x16\n"
	"2:	stp	x29, x30, [sp, #-32]!\n"
	"	.cfi_def_cfa_offset 32\n"
	"	.cfi_offset 29, -32\n"
	"	.cfi_offset 30, -24\n"
	"	mov	x29, sp\n"
	"	stp	x0, x1, [sp, #16]\n"
	"	bl	emm_real_dlsym_get\n"
	"	mov	x16, x0\n"
	"	ldp	x0, x1, [sp, #16]\n"
	"	ldp	x29, x30, [sp], #32\n"
	"	.cfi_restore 30\n"
	"	.cfi_restore 29\n"
	"	.cfi_def_cfa_offset 0\n"
	"	br	x16\n"
	"	.cfi_endproc\n"
	"	.size	dlsym, .-dlsym\n"
	".popsection\n");
/* clang-format on */

#else

/*
 * Other architectures: the forward is a C tail call, which the compiler
 * emits as a jump only when optimising (-O1 and up, no -fno-optimize-
 * sibling-calls); tests/interpose/test-rtld-next fails otherwise.
 */
#if !defined(__OPTIMIZE__)
#warning "dlsym pass-through needs a tail call: build libemm with optimisation on this architecture"
#endif

/* `used`: the trampoline below jumps here from asm, which link-time
 * optimisation does not see. */
__attribute__((used)) void *emm_dlsym_explicit(void *handle, const char *name)
{
	return dlsym_explicit(handle, name, __builtin_return_address(0));
}

/* No sanitizer instrumentation: a sanitizer runtime's start-up comes here
 * (RTLD_NEXT) before it is ready, as to the assembly trampolines above. */
EMM_EXPORT EMM_NO_SANITIZE void *dlsym(void *handle, const char *name)
{
	if (handle == RTLD_NEXT || handle == RTLD_DEFAULT)
		return emm_real_dlsym_get()(handle, name);
	return dlsym_explicit(handle, name, __builtin_return_address(0));
}

#endif

/* --- cuGetProcAddress ------------------------------------------------------ */

/*
 * The driver's result with libemm's shim in place of the exact export it
 * names, when the lookup succeeded: CUDA_SUCCESS, a pointer, and a status
 * (when the caller asked for one) of SUCCESS. Works before cuInit: nothing
 * here calls the driver except the real resolver. symbolStatus may be NULL
 * (cudart and cuda-python pass NULL) and is never written by libemm.
 */
EMM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbolStatus)
{
	const struct emm_real_driver_table *real = emm_real_driver_table();
	CUresult res;

	/* Only reachable through a libcuda that has the export; a driver
	 * without it cannot resolve anything. */
	if (!real || !real->cuGetProcAddress_v2)
		return CUDA_ERROR_NOT_SUPPORTED;
	res = real->cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
	if (res == CUDA_SUCCESS && pfn && *pfn &&
	    (!symbolStatus || *symbolStatus == CU_GET_PROC_ADDRESS_SUCCESS))
		*pfn = resolved("cuGetProcAddress_v2", symbol, cudaVersion, *pfn, __builtin_return_address(0));
	return res;
}

/* The 4-argument ABI (CUDA 11.3 - 11.8 callers, and cudart asking for
 * "cuGetProcAddress" at version 11030). */
EMM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	const struct emm_real_driver_table *real = emm_real_driver_table();
	CUresult res;

	if (!real)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (real->cuGetProcAddress_v1)
		res = real->cuGetProcAddress_v1(symbol, pfn, cudaVersion, flags);
	else if (real->cuGetProcAddress_v2)
		res = real->cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
	else
		return CUDA_ERROR_NOT_SUPPORTED;
	if (res == CUDA_SUCCESS && pfn && *pfn)
		*pfn = resolved("cuGetProcAddress", symbol, cudaVersion, *pfn, __builtin_return_address(0));
	return res;
}

void *emm_resolver_shim_for(const char *exported_name)
{
	if (!exported_name)
		return NULL;
	if (strcmp(exported_name, "cuGetProcAddress_v2") == 0)
		return (void *)&cuGetProcAddress_v2;
	if (strcmp(exported_name, "cuGetProcAddress") == 0)
		return (void *)&cuGetProcAddress;
	return NULL;
}

/* --- cudaGetDriverEntryPoint* ---------------------------------------------- */

/*
 * For programs linked to shared cudart. Its own resolver pointer is already
 * ours (it bootstraps through dlsym), so what comes back is usually already
 * a shim; substituting again is idempotent and covers a cudart that got the
 * driver's resolver before libemm was loaded. Without a runtime to forward
 * to (cannot happen for a caller linked to one) the answer is
 * cudaErrorInitializationError, as shims_runtime.c does.
 */
typedef cudaError_t (*entry_point_fn)(const char *, void **, unsigned long long,
                                      enum cudaDriverEntryPointQueryResult *);
typedef cudaError_t (*entry_point_by_version_fn)(const char *, void **, unsigned int, unsigned long long,
                                                 enum cudaDriverEntryPointQueryResult *);

static cudaError_t entry_point_result(const char *symbol, cudaError_t err, void **funcPtr,
                                      enum cudaDriverEntryPointQueryResult *status, const void *caller)
{
	if (err == cudaSuccess && funcPtr && *funcPtr && (!status || *status == cudaDriverEntryPointSuccess))
		*funcPtr = resolved("cudaGetDriverEntryPoint", symbol, 0, *funcPtr, caller);
	return err;
}

EMM_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                               enum cudaDriverEntryPointQueryResult *driverStatus)
{
	entry_point_fn real = (entry_point_fn)emm_real_runtime("cudaGetDriverEntryPoint");

	if (!real)
		return cudaErrorInitializationError;
	return entry_point_result(symbol, real(symbol, funcPtr, flags, driverStatus), funcPtr, driverStatus,
	                          __builtin_return_address(0));
}

EMM_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *driverStatus)
{
	entry_point_fn real = (entry_point_fn)emm_real_runtime("cudaGetDriverEntryPoint_ptsz");

	if (!real)
		return cudaErrorInitializationError;
	return entry_point_result(symbol, real(symbol, funcPtr, flags, driverStatus), funcPtr, driverStatus,
	                          __builtin_return_address(0));
}

EMM_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                        unsigned int cudaVersion, unsigned long long flags,
                                                        enum cudaDriverEntryPointQueryResult *driverStatus)
{
	entry_point_by_version_fn real =
	    (entry_point_by_version_fn)emm_real_runtime("cudaGetDriverEntryPointByVersion");

	if (!real)
		return cudaErrorInitializationError;
	return entry_point_result(symbol, real(symbol, funcPtr, cudaVersion, flags, driverStatus), funcPtr,
	                          driverStatus, __builtin_return_address(0));
}

EMM_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus)
{
	entry_point_by_version_fn real =
	    (entry_point_by_version_fn)emm_real_runtime("cudaGetDriverEntryPointByVersion_ptsz");

	if (!real)
		return cudaErrorInitializationError;
	return entry_point_result(symbol, real(symbol, funcPtr, cudaVersion, flags, driverStatus), funcPtr,
	                          driverStatus, __builtin_return_address(0));
}
