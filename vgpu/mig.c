/*
 * MIG device handles and running processes. A MIG device is a slot of vgpu_gpu.mig: its handle
 * is valid while the GPU is in MIG mode and the slot is below mig_count; the parent's fault
 * flags apply to it too.
 */
#include <string.h>

#include "internal.h"

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, currentMode != NULL && pendingMode != NULL, VGPU_Q_MIG, 0, &c);
    if (ret == NVML_SUCCESS) {
        *currentMode = c.rec.mig_mode;
        *pendingMode = c.rec.mig_mode_pending;
    }
    return ret;
}

/* Zero, not an error, on a GPU without MIG or with MIG disabled: the header's wording. */
GETTER(nvmlDeviceGetMaxMigDeviceCount, unsigned int, VGPU_NO_QUERY,
       vgpu_query_unsupported(&c.rec, VGPU_Q_MIG) || c.rec.mig_mode != NVML_DEVICE_MIG_ENABLE ? 0 : c.rec.mig_max)

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                             nvmlDevice_t *migDevice)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, migDevice != NULL, VGPU_Q_MIG, VGPU_ACCEPT_MIG, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (c.mig >= 0)
        return NVML_ERROR_INVALID_ARGUMENT; /* a MIG device has no MIG devices */
    unsigned int max = c.rec.mig_mode == NVML_DEVICE_MIG_ENABLE ? c.rec.mig_max : 0;
    if (index >= max)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= c.rec.mig_count)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = vgpu_mig_handle(c.gpu, index, &c.rec);
    return NVML_SUCCESS;
}

/* "This API currently only supports MIG device handles." */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, attributes != NULL, VGPU_Q_MIG, VGPU_ACCEPT_MIG, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (c.mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    const struct vgpu_mig_attributes *a = &c.rec.more.mig_attributes[c.mig];
    *attributes = (nvmlDeviceAttributes_t){
        .multiprocessorCount = a->sms,
        .sharedCopyEngineCount = a->copy_engines,
        .sharedDecoderCount = a->decoders,
        .sharedEncoderCount = a->encoders,
        .sharedJpegCount = a->jpegs,
        .sharedOfaCount = a->ofas,
        .gpuInstanceSliceCount = a->gpu_instance_slices,
        .computeInstanceSliceCount = a->compute_instance_slices,
        .memorySizeMB = a->memory_mb,
    };
    return NVML_SUCCESS;
}

/* The GPU instance profiles of a GPU: by NVML_GPU_INSTANCE_PROFILE_* index; one the GPU does not
 * offer is NOT_SUPPORTED, as is every profile while MIG is disabled. No privileges needed: the
 * header asks for none here, unlike for creating or listing instances. */
static nvmlReturn_t profile_info(nvmlDevice_t device, unsigned int profile, const struct vgpu_mig_profile **out,
                                 struct vgpu_call *c, int args_ok)
{
    args_ok = args_ok && profile < NVML_GPU_INSTANCE_PROFILE_COUNT;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_MIG_PROFILES, 0, c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (c->rec.mig_mode != NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned int i = 0; i < c->rec.more.mig_profile_count && i < VGPU_MAX_MIG_PROFILES; i++)
        if (c->rec.more.mig_profiles[i].profile == profile) {
            *out = &c->rec.more.mig_profiles[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_SUPPORTED;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                              nvmlGpuInstanceProfileInfo_v2_t *info)
{
    struct vgpu_call c;
    const struct vgpu_mig_profile *p = NULL;
    nvmlReturn_t ret = profile_info(device, profile, &p, &c, info != NULL);
    if (ret != NVML_SUCCESS)
        return ret;
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_INVALID_ARGUMENT; /* the header lists a bad info->version under INVALID_ARGUMENT */
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sms;
    info->copyEngineCount = p->copy_engines;
    info->decoderCount = p->decoders;
    info->encoderCount = p->encoders;
    info->jpegCount = p->jpegs;
    info->ofaCount = p->ofas;
    info->memorySizeMB = p->memory_mb;
    return vgpu_copy_string(info->name, sizeof info->name, p->name, sizeof p->name);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, isMigDevice != NULL, VGPU_NO_QUERY, VGPU_ACCEPT_MIG, &c);
    if (ret == NVML_SUCCESS)
        *isMigDevice = c.mig >= 0;
    return ret;
}

static nvmlReturn_t instance_id(nvmlDevice_t device, int compute, unsigned int *id)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, id != NULL, VGPU_Q_MIG, VGPU_ACCEPT_MIG, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (c.mig < 0)
        return NVML_ERROR_NOT_SUPPORTED; /* a whole GPU is no instance */
    *id = compute ? c.rec.mig[c.mig].compute_instance_id : c.rec.mig[c.mig].gpu_instance_id;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, 0, id);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, 1, id);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(migDevice, device != NULL, VGPU_Q_MIG, VGPU_ACCEPT_MIG, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (c.mig < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = vgpu_gpu_handle(c.gpu);
    return NVML_SUCCESS;
}

/* -- running processes ----------------------------------------------------------------------- */

/*
 * infoCount in, the capacity of infos; out, the number of processes. Too small a capacity
 * answers INSUFFICIENT_SIZE with the count, which is how callers size their buffer. On a MIG
 * device handle, only the processes in that instance.
 */
static nvmlReturn_t processes(nvmlDevice_t device, uint32_t kind, unsigned int *infoCount, void *infos, int v1)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, infoCount != NULL, VGPU_Q_PROCESSES, VGPU_ACCEPT_MIG, &c);
    if (ret == NVML_SUCCESS)
        ret = vgpu_aggregate_allowed(&c);
    if (ret != NVML_SUCCESS)
        return ret;
    const struct vgpu_proc *match[VGPU_MAX_PROCS];
    unsigned int n = 0;
    for (unsigned int i = 0; i < c.rec.proc_count; i++) {
        const struct vgpu_proc *p = &c.rec.procs[i];
        if (!(p->kinds & kind))
            continue;
        if (c.mig >= 0 && (p->gpu_instance_id != c.rec.mig[c.mig].gpu_instance_id ||
                           p->compute_instance_id != c.rec.mig[c.mig].compute_instance_id))
            continue;
        match[n++] = p;
    }
    if (*infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && infos == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *out = (nvmlProcessInfo_v1_t *)infos + i;
            out->pid = match[i]->pid;
            out->usedGpuMemory = match[i]->used_memory;
        } else {
            nvmlProcessInfo_t *out = (nvmlProcessInfo_t *)infos + i;
            out->pid = match[i]->pid;
            out->usedGpuMemory = match[i]->used_memory;
            out->gpuInstanceId = match[i]->gpu_instance_id;
            out->computeInstanceId = match[i]->compute_instance_id;
        }
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

#define PROCESS_QUERY(fn, kind, info_type, v1)                                                                        \
    NVML_EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *infoCount, info_type *infos)                       \
    {                                                                                                                 \
        return processes(device, kind, infoCount, infos, v1);                                                         \
    }

PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses_v3, VGPU_PROC_COMPUTE, nvmlProcessInfo_t, 0)
PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses_v2, VGPU_PROC_COMPUTE, nvmlProcessInfo_v2_t, 0)
PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses, VGPU_PROC_COMPUTE, nvmlProcessInfo_v1_t, 1)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses_v3, VGPU_PROC_GRAPHICS, nvmlProcessInfo_t, 0)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses_v2, VGPU_PROC_GRAPHICS, nvmlProcessInfo_v2_t, 0)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses, VGPU_PROC_GRAPHICS, nvmlProcessInfo_v1_t, 1)
