/* Library lifetime, system queries, device handles and the gate every device call goes through. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Handles are addresses of these elements, fixed for the life of the process. That is what
 * makes "the old handle works again after a reset" true, and what lets resolve() tell our
 * handles from anyone else's without dereferencing a stranger's pointer. */
static struct nvmlDevice_st g_gpu_handles[VGPU_MAX_GPUS];
static struct nvmlDevice_st g_mig_handles[VGPU_MAX_GPUS * VGPU_MAX_MIG];
static pthread_once_t g_handles_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint g_refcount;

#define HUNG_POLL_US 2000

static int g_unprivileged; /* read from the environment by the first nvmlInit */

static void handles_init(void)
{
    for (unsigned int g = 0; g < VGPU_MAX_GPUS; g++) {
        g_gpu_handles[g] = (struct nvmlDevice_st){g, -1, 0};
        for (unsigned int m = 0; m < VGPU_MAX_MIG; m++)
            g_mig_handles[g * VGPU_MAX_MIG + m] = (struct nvmlDevice_st){g, (int)m, 0};
    }
    const char *flag = getenv("GPU_TRIAGE_VGPU_UNPRIVILEGED");
    g_unprivileged = flag != NULL && strcmp(flag, "1") == 0;
}

int vgpu_privileged(void)
{
    return !g_unprivileged;
}

nvmlReturn_t vgpu_aggregate_allowed(const struct vgpu_call *c)
{
    if (c->mig < 0 && c->rec.mig_mode == NVML_DEVICE_MIG_ENABLE && !vgpu_privileged())
        return NVML_ERROR_NO_PERMISSION;
    return NVML_SUCCESS;
}

nvmlDevice_t vgpu_gpu_handle(unsigned int gpu)
{
    return (nvmlDevice_t){&g_gpu_handles[gpu]};
}

nvmlDevice_t vgpu_mig_handle(unsigned int gpu, unsigned int slot, const struct vgpu_gpu *rec)
{
    struct nvmlDevice_st *d = &g_mig_handles[gpu * VGPU_MAX_MIG + slot];
    atomic_store(&d->generation, rec->more.reset_generation);
    return (nvmlDevice_t){d};
}

static int element_of(uintptr_t p, const void *array, size_t size)
{
    uintptr_t a = (uintptr_t)array;
    return p >= a && p < a + size && (p - a) % sizeof(struct nvmlDevice_st) == 0;
}

static const struct nvmlDevice_st *resolve(nvmlDevice_t device)
{
    uintptr_t p = (uintptr_t)device.handle;
    if (element_of(p, g_gpu_handles, sizeof g_gpu_handles) || element_of(p, g_mig_handles, sizeof g_mig_handles))
        return device.handle;
    return NULL;
}

int vgpu_initialized(void)
{
    return atomic_load(&g_refcount) > 0;
}

int vgpu_query_unsupported(const struct vgpu_gpu *gpu, int query)
{
    return query >= 0 && (gpu->unsupported >> query) & 1;
}

nvmlReturn_t vgpu_copy_string(char *dst, unsigned int length, const char *src, size_t src_size)
{
    size_t n = strnlen(src, src_size - 1);
    if (length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return NVML_SUCCESS;
}

#define VGPU_HANDLE_LOOKUP 0x100u /* a handle lookup: succeeds while a reset is in flight */

nvmlReturn_t vgpu_begin(nvmlDevice_t device, int args_ok, int query, unsigned int flags, struct vgpu_call *call)
{
    if (!vgpu_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!args_ok)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct nvmlDevice_st *d = resolve(device);
    if (d == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct vgpu_header h;
    nvmlReturn_t ret = vgpu_read_header(&h);
    if (ret != NVML_SUCCESS)
        return ret;
    if (d->gpu >= h.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t hung_since = 0;
    for (;;) {
        ret = vgpu_read_gpu(d->gpu, &call->rec);
        if (ret != NVML_SUCCESS)
            return ret;
        if (call->rec.flags & VGPU_F_LOST)
            return NVML_ERROR_GPU_IS_LOST;
        if ((call->rec.flags & VGPU_F_INVALID_HANDLE) && !(flags & VGPU_HANDLE_LOOKUP))
            return NVML_ERROR_INVALID_ARGUMENT;
        if (!(call->rec.flags & VGPU_F_HUNG))
            break;
        /* A hung driver call returns when the GPU recovers, or gives up with an error. */
        uint64_t now = vgpu_now_ns();
        if (hung_since == 0)
            hung_since = now;
        else if (now - hung_since >= (uint64_t)h.hang_max_ms * 1000000ull)
            return NVML_ERROR_UNKNOWN;
        vgpu_sleep_us(HUNG_POLL_US);
    }
    if (d->mig >= 0) {
        /* A MIG device handle outlives its instance, and a reset of its GPU ("If the parent device is
         * unbound, reset ... the GPU instance handle would become invalid"), only as an invalid handle. */
        if (call->rec.mig_mode != NVML_DEVICE_MIG_ENABLE || (unsigned int)d->mig >= call->rec.mig_count ||
            atomic_load(&d->generation) != call->rec.more.reset_generation)
            return NVML_ERROR_INVALID_ARGUMENT;
        if (!(flags & VGPU_ACCEPT_MIG))
            return NVML_ERROR_NOT_SUPPORTED;
    }
    if (vgpu_query_unsupported(&call->rec, query))
        return NVML_ERROR_NOT_SUPPORTED;
    call->gpu = d->gpu;
    call->mig = d->mig;
    return NVML_SUCCESS;
}

/* -- lifetime ------------------------------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    pthread_once(&g_handles_once, handles_init);
    pthread_mutex_lock(&g_init_lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (atomic_load(&g_refcount) == 0) {
        ret = vgpu_state_open();
        struct vgpu_header h;
        if (ret == NVML_SUCCESS)
            ret = vgpu_read_header(&h);
        if (ret == NVML_SUCCESS && h.gpu_count == 0 && !(flags & NVML_INIT_FLAG_NO_GPUS))
            ret = NVML_ERROR_GPU_NOT_FOUND;
    }
    if (ret == NVML_SUCCESS)
        atomic_fetch_add(&g_refcount, 1);
    pthread_mutex_unlock(&g_init_lock);
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

NVML_EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_init_lock);
    nvmlReturn_t ret = NVML_ERROR_UNINITIALIZED;
    if (atomic_load(&g_refcount) > 0) {
        atomic_fetch_sub(&g_refcount, 1);
        ret = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_init_lock);
    return ret;
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

/* -- system --------------------------------------------------------------------------------- */

static nvmlReturn_t system_header(int args_ok, struct vgpu_header *h)
{
    if (!vgpu_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!args_ok)
        return NVML_ERROR_INVALID_ARGUMENT;
    return vgpu_read_header(h);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    struct vgpu_header h;
    nvmlReturn_t ret = system_header(version != NULL, &h);
    return ret ? ret : vgpu_copy_string(version, length, h.driver_version, sizeof h.driver_version);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    struct vgpu_header h;
    nvmlReturn_t ret = system_header(version != NULL, &h);
    return ret ? ret : vgpu_copy_string(version, length, h.nvml_version, sizeof h.nvml_version);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    struct vgpu_header h;
    nvmlReturn_t ret = system_header(cudaDriverVersion != NULL, &h);
    if (ret == NVML_SUCCESS)
        *cudaDriverVersion = h.cuda_driver_version;
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* -- finding devices ------------------------------------------------------------------------ */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    struct vgpu_header h;
    nvmlReturn_t ret = system_header(deviceCount != NULL, &h);
    if (ret == NVML_SUCCESS)
        *deviceCount = h.gpu_count; /* lost GPUs included, as the driver still enumerates them */
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

static nvmlReturn_t hand_out(nvmlDevice_t handle, nvmlDevice_t *device)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(handle, 1, VGPU_NO_QUERY, VGPU_HANDLE_LOOKUP | VGPU_ACCEPT_MIG, &c);
    if (ret == NVML_SUCCESS)
        *device = handle;
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    struct vgpu_header h;
    nvmlReturn_t ret = system_header(device != NULL, &h);
    if (ret != NVML_SUCCESS)
        return ret;
    if (index >= h.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    return hand_out(vgpu_gpu_handle(index), device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* Finds the device `match` accepts; MIG devices are matched too, by their own UUIDs. */
static nvmlReturn_t find_device(int args_ok, nvmlDevice_t *device, int (*match)(const char *key, const char *uuid,
                                                                                 const struct vgpu_gpu *gpu),
                                const char *key)
{
    struct vgpu_header h;
    nvmlReturn_t ret = system_header(args_ok, &h);
    if (ret != NVML_SUCCESS)
        return ret;
    for (unsigned int i = 0; i < h.gpu_count; i++) {
        struct vgpu_gpu g;
        ret = vgpu_read_gpu(i, &g);
        if (ret != NVML_SUCCESS)
            return ret;
        if (match(key, g.uuid, &g))
            return hand_out(vgpu_gpu_handle(i), device);
        for (unsigned int m = 0; g.mig_mode == NVML_DEVICE_MIG_ENABLE && m < g.mig_count; m++)
            if (match(key, g.mig[m].uuid, NULL))
                return hand_out(vgpu_mig_handle(i, m, &g), device);
    }
    return NVML_ERROR_NOT_FOUND;
}

static int match_uuid(const char *key, const char *uuid, const struct vgpu_gpu *gpu)
{
    (void)gpu;
    return strncmp(key, uuid, NVML_DEVICE_UUID_V2_BUFFER_SIZE) == 0;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    return find_device(uuid != NULL && device != NULL, device, match_uuid, uuid);
}

/* Accepts the forms NVML prints and takes: "00000000:18:00.0", "0000:18:00.0" and "18:00.0". */
static int parse_bus_id(const char *text, unsigned int id[4])
{
    int used = -1;
    if (sscanf(text, "%x:%x:%x.%x%n", &id[0], &id[1], &id[2], &id[3], &used) == 4 && text[used] == '\0')
        return 1;
    used = -1;
    id[0] = 0;
    return sscanf(text, "%x:%x.%x%n", &id[1], &id[2], &id[3], &used) == 3 && text[used] == '\0';
}

static int match_bus_id(const char *key, const char *uuid, const struct vgpu_gpu *gpu)
{
    (void)uuid;
    unsigned int id[4];
    return gpu != NULL && parse_bus_id(key, id) && id[0] == gpu->pci_domain && id[1] == gpu->pci_bus &&
           id[2] == gpu->pci_device && id[3] == 0;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned int id[4];
    int args_ok = pciBusId != NULL && device != NULL && parse_bus_id(pciBusId, id);
    return find_device(args_ok, device, match_bus_id, pciBusId);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* Introspection for the tests, which hold the Python writer to the layout and the default node
 * this build has. */
NVML_EXPORT unsigned int vgpuStateLayout(unsigned int *headerSize, unsigned int *gpuSize, unsigned int *fileSize)
{
    *headerSize = sizeof(struct vgpu_header);
    *gpuSize = sizeof(struct vgpu_gpu);
    *fileSize = VGPU_FILE_SIZE;
    return VGPU_LAYOUT_VERSION;
}

NVML_EXPORT int vgpuDefaultImage(void *buffer, size_t size)
{
    if (buffer == NULL || size < sizeof(struct vgpu_image))
        return -1;
    struct vgpu_image *image = malloc(sizeof *image);
    if (image == NULL)
        return -1;
    vgpu_default_image(image);
    memcpy(buffer, image, sizeof *image);
    free(image);
    return 0;
}
