/*
 * The CUDA runtime and driver calls of the data plane, found with dlsym() in
 * the libraries torch loaded (see _cuda.h). The runtime shares the device's
 * primary context with torch, so a pointer torch allocated is valid here on
 * any thread once that thread has set the device.
 */
#include "_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define CUDA_MEMCPY_DEFAULT 4
#define CUDA_IPC_LAZY_PEER_ACCESS 1

typedef struct {
    unsigned char reserved[CUDA_IPC_HANDLE_SIZE];
} ipc_handle_t;

static struct {
    int (*set_device)(int);
    int (*memcpy)(void *, const void *, size_t, int);
    int (*synchronize)(void);
    int (*stream_sync)(void *);
    int (*host_alloc)(void **, size_t, unsigned int);
    int (*free_host)(void *);
    int (*ipc_get)(ipc_handle_t *, void *);
    int (*ipc_open)(void **, ipc_handle_t, unsigned int);
    int (*ipc_close)(void *);
    const char *(*error_string)(int);
    int (*address_range)(unsigned long long *, size_t *, unsigned long long);
} api;

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded = 0;

static int find(void *lib, const char *name, void **out, char *why, size_t why_len) {
    *out = dlsym(lib, name);
    if (*out == NULL) {
        snprintf(why, why_len, "%s has no symbol %s", "the CUDA library", name);
        return -1;
    }
    return 0;
}

int cuda_load(const char *cudart_path, char *why, size_t why_len) {
    pthread_mutex_lock(&load_lock);
    if (loaded) {
        pthread_mutex_unlock(&load_lock);
        return 0;
    }
    int rc = -1;
    void *rt = dlopen(cudart_path, RTLD_NOW | RTLD_LOCAL);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (rt == NULL || drv == NULL) {
        snprintf(why, why_len, "cannot open %s: %s", rt == NULL ? cudart_path : "libcuda.so.1",
                 dlerror());
        goto out;
    }
    /* Each dlsym result is stored through a void* of the matching field. */
    struct {
        void *lib;
        const char *name;
        void **slot;
    } table[] = {
        {rt, "cudaSetDevice", (void **)&api.set_device},
        {rt, "cudaMemcpy", (void **)&api.memcpy},
        {rt, "cudaDeviceSynchronize", (void **)&api.synchronize},
        {rt, "cudaStreamSynchronize", (void **)&api.stream_sync},
        {rt, "cudaHostAlloc", (void **)&api.host_alloc},
        {rt, "cudaFreeHost", (void **)&api.free_host},
        {rt, "cudaIpcGetMemHandle", (void **)&api.ipc_get},
        {rt, "cudaIpcOpenMemHandle", (void **)&api.ipc_open},
        {rt, "cudaIpcCloseMemHandle", (void **)&api.ipc_close},
        {rt, "cudaGetErrorString", (void **)&api.error_string},
        {drv, "cuMemGetAddressRange_v2", (void **)&api.address_range},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (find(table[i].lib, table[i].name, table[i].slot, why, why_len) != 0) goto out;
    loaded = 1;
    rc = 0;
out:
    pthread_mutex_unlock(&load_lock);
    return rc;
}

int cuda_loaded(void) { return __atomic_load_n(&loaded, __ATOMIC_ACQUIRE); }

const char *cuda_error(int code) {
    if (code == -1) return "the CUDA runtime is not loaded";
    if (!cuda_loaded()) return "see cudaError_t in the CUDA runtime's documentation";
    const char *s = api.error_string(code);
    return s != NULL ? s : "unknown CUDA error";
}

int cuda_copy(int device, void *dst, const void *src, size_t n) {
    if (!cuda_loaded()) return -1;
    int rc = api.set_device(device);
    return rc != 0 ? rc : api.memcpy(dst, src, n, CUDA_MEMCPY_DEFAULT);
}

int cuda_sync(int device) {
    if (!cuda_loaded()) return -1;
    int rc = api.set_device(device);
    return rc != 0 ? rc : api.synchronize();
}

int cuda_host_alloc(void **out, size_t n) {
    if (!cuda_loaded()) return -1;
    return api.host_alloc(out, n, 0);
}

void cuda_host_free(void *p) {
    if (p != NULL && cuda_loaded()) api.free_host(p);
}

int cuda_ipc_export(int device, uintptr_t ptr, unsigned char handle[CUDA_IPC_HANDLE_SIZE],
                    uint64_t *offset) {
    if (!cuda_loaded()) return -1;
    int rc = api.set_device(device);
    if (rc != 0) return rc;
    unsigned long long base = 0;
    size_t size = 0;
    /* A driver error (CUresult) is not a runtime error code: report it as "invalid value". */
    if (api.address_range(&base, &size, (unsigned long long)ptr) != 0) return 1;
    ipc_handle_t h;
    rc = api.ipc_get(&h, (void *)(uintptr_t)base);
    if (rc != 0) return rc;
    memcpy(handle, h.reserved, CUDA_IPC_HANDLE_SIZE);
    *offset = (uint64_t)(ptr - (uintptr_t)base);
    return 0;
}

/* Mappings kept between copies. A slot in use is never closed; the least
 * recently used idle one makes room. Guarded by cache_lock. */
#define IPC_CACHE 16
static struct {
    int used, device, users;
    unsigned char handle[CUDA_IPC_HANDLE_SIZE];
    void *base;
    unsigned long stamp;
} cache[IPC_CACHE];
static unsigned long cache_clock = 0;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static int open_mapping(int device, const unsigned char *handle, void **base) {
    int rc = api.set_device(device);
    if (rc != 0) return rc;
    ipc_handle_t h;
    memcpy(h.reserved, handle, CUDA_IPC_HANDLE_SIZE);
    return api.ipc_open(base, h, CUDA_IPC_LAZY_PEER_ACCESS);
}

static void close_mapping(int device, void *base) {
    if (api.set_device(device) == 0) api.ipc_close(base);
}

int cuda_ipc_map(int device, const unsigned char handle[CUDA_IPC_HANDLE_SIZE], void **base,
                 int *slot) {
    if (!cuda_loaded()) return -1;
    pthread_mutex_lock(&cache_lock);
    int free_slot = -1, idle = -1;
    for (int i = 0; i < IPC_CACHE; i++) {
        if (cache[i].used && cache[i].device == device &&
            memcmp(cache[i].handle, handle, CUDA_IPC_HANDLE_SIZE) == 0) {
            cache[i].users++;
            cache[i].stamp = ++cache_clock;
            *base = cache[i].base;
            *slot = i;
            pthread_mutex_unlock(&cache_lock);
            return 0;
        }
        if (!cache[i].used && free_slot < 0) free_slot = i;
        if (cache[i].used && cache[i].users == 0 && (idle < 0 || cache[i].stamp < cache[idle].stamp))
            idle = i;
    }
    if (free_slot < 0 && idle >= 0) {
        close_mapping(cache[idle].device, cache[idle].base);
        cache[idle].used = 0;
        free_slot = idle;
    }
    /* Opened under the lock: two threads never map the same allocation twice. */
    int rc = open_mapping(device, handle, base);
    *slot = -1;
    if (rc == 0 && free_slot >= 0) {
        cache[free_slot].used = 1;
        cache[free_slot].device = device;
        cache[free_slot].users = 1;
        cache[free_slot].base = *base;
        cache[free_slot].stamp = ++cache_clock;
        memcpy(cache[free_slot].handle, handle, CUDA_IPC_HANDLE_SIZE);
        *slot = free_slot;
    }
    pthread_mutex_unlock(&cache_lock);
    return rc;
}

void cuda_ipc_done(int device, void *base, int slot) {
    if (slot < 0) {
        close_mapping(device, base); /* every slot was busy: this one was not kept */
        return;
    }
    pthread_mutex_lock(&cache_lock);
    cache[slot].users--;
    pthread_mutex_unlock(&cache_lock);
}

void cuda_ipc_forget(int device, const unsigned char handle[CUDA_IPC_HANDLE_SIZE]) {
    if (!cuda_loaded()) return;
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < IPC_CACHE; i++) {
        if (cache[i].used && cache[i].users == 0 && cache[i].device == device &&
            memcmp(cache[i].handle, handle, CUDA_IPC_HANDLE_SIZE) == 0) {
            close_mapping(device, cache[i].base);
            cache[i].used = 0;
        }
    }
    pthread_mutex_unlock(&cache_lock);
}

int cuda_stream_sync(int device) {
    if (!cuda_loaded()) return -1;
    int rc = api.set_device(device);
    return rc != 0 ? rc : api.stream_sync(NULL);
}
