/*
 * CUDA for the data plane, without linking against CUDA: the runtime that
 * torch already loaded is opened with dlopen() when the first CUDA buffer is
 * registered or read, so the extension builds and imports on machines with no
 * CUDA at all. Every function returns 0 or a CUDA error code (cuda_error()
 * names it); -1 means the runtime was never loaded.
 */
#ifndef MONARCH_NB_CUDA_H
#define MONARCH_NB_CUDA_H

#include <stddef.h>
#include <stdint.h>

#define CUDA_IPC_HANDLE_SIZE 64

/* Load the runtime at `cudart_path` (and the driver, for allocation ranges).
 * Returns 0, or -1 with a reason in `why`. Idempotent. */
int cuda_load(const char *cudart_path, char *why, size_t why_len);
int cuda_loaded(void);
const char *cuda_error(int code);

/* cudaMemcpy(dst, src, n, cudaMemcpyDefault) on `device` (the calling thread's
 * current device is set first): host<->device and device<->device alike. */
int cuda_copy(int device, void *dst, const void *src, size_t n);

/* Wait for everything queued on `device` in this process (cudaDeviceSynchronize). */
int cuda_sync(int device);

/* Page-locked host memory for staging (synchronous copies from it complete
 * before cudaMemcpy returns). */
int cuda_host_alloc(void **out, size_t n);
void cuda_host_free(void *p);

/* An IPC handle for the allocation holding `ptr` on `device`, and how far
 * `ptr` lies past the allocation's start. */
int cuda_ipc_export(int device, uintptr_t ptr, unsigned char handle[CUDA_IPC_HANDLE_SIZE],
                    uint64_t *offset);
/* Map another process's allocation on `device` for one copy: a mapping is kept
 * for the next copy of the same allocation (opening one costs far more than a
 * small copy), up to a few allocations. `*slot` goes to cuda_ipc_done. */
int cuda_ipc_map(int device, const unsigned char handle[CUDA_IPC_HANDLE_SIZE], void **base,
                 int *slot);
void cuda_ipc_done(int device, void *base, int slot);
/* Unmap an allocation whose region was dropped (once no copy uses it). */
void cuda_ipc_forget(int device, const unsigned char handle[CUDA_IPC_HANDLE_SIZE]);

/* Wait for the copies this thread queued (the legacy default stream). */
int cuda_stream_sync(int device);

#endif
