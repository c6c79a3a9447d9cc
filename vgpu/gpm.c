/*
 * GPM. The state file holds each GPU's (and MIG instance's) metric values as the simulator
 * computes them; a sample is a copy of those values at nvmlGpmSampleGet, and
 * nvmlGpmMetricsGet reports the values of the later sample of the pair: "the metric over the
 * interval that ended at sample2". The first sample is checked, not used.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

struct nvmlGpmSample_st {
    int taken;
    unsigned int gpu;
    int mig;
    uint64_t order; /* which of two samples was taken later */
    struct vgpu_gpm gpm;
    struct nvmlGpmSample_st *next;
};

/* As with event sets, samples are looked up before use: a foreign or freed one is refused. */
static pthread_mutex_t g_samples_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvmlGpmSample_st *g_samples;
static atomic_ullong g_order;

static struct nvmlGpmSample_st *find_sample(nvmlGpmSample_t sample, int unlink)
{
    pthread_mutex_lock(&g_samples_lock);
    struct nvmlGpmSample_st **p = &g_samples;
    while (*p != NULL && *p != sample.handle)
        p = &(*p)->next;
    struct nvmlGpmSample_st *found = *p;
    if (found != NULL && unlink)
        *p = found->next;
    pthread_mutex_unlock(&g_samples_lock);
    return found;
}

NVML_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    if (!vgpu_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (gpmSample == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlGpmSample_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NVML_ERROR_MEMORY;
    pthread_mutex_lock(&g_samples_lock);
    s->next = g_samples;
    g_samples = s;
    pthread_mutex_unlock(&g_samples_lock);
    gpmSample->handle = s;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    if (!vgpu_initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct nvmlGpmSample_st *s = find_sample(gpmSample, 1);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    free(s);
    return NVML_SUCCESS;
}

static void take(struct nvmlGpmSample_st *s, const struct vgpu_call *c, int mig)
{
    s->gpm = mig < 0 ? c->rec.gpm : c->rec.mig[mig].gpm;
    s->gpu = c->gpu;
    s->mig = mig;
    s->order = atomic_fetch_add(&g_order, 1) + 1;
    s->taken = 1;
}

NVML_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    struct vgpu_call c;
    struct nvmlGpmSample_st *s = vgpu_initialized() ? find_sample(gpmSample, 0) : NULL;
    nvmlReturn_t ret = vgpu_begin(device, s != NULL, VGPU_Q_GPM, VGPU_ACCEPT_MIG, &c);
    if (ret == NVML_SUCCESS)
        take(s, &c, c.mig);
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample)
{
    struct vgpu_call c;
    struct nvmlGpmSample_st *s = vgpu_initialized() ? find_sample(gpmSample, 0) : NULL;
    nvmlReturn_t ret = vgpu_begin(device, s != NULL, VGPU_Q_GPM, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    for (unsigned int m = 0; c.rec.mig_mode == NVML_DEVICE_MIG_ENABLE && m < c.rec.mig_count; m++) {
        if (c.rec.mig[m].gpu_instance_id == gpuInstanceId) {
            take(s, &c, (int)m);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

NVML_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, gpmSupport != NULL, VGPU_NO_QUERY, VGPU_ACCEPT_MIG, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    gpmSupport->isSupportedDevice = !vgpu_query_unsupported(&c.rec, VGPU_Q_GPM);
    return NVML_SUCCESS;
}

struct metric_info {
    unsigned int id;
    const char *short_name, *long_name, *unit;
};

static const struct metric_info k_metric_info[] = {
    {1, "gr_util", "graphics activity", "%"},
    {2, "sm_util", "SM activity", "%"},
    {3, "sm_occupancy", "SM occupancy", "%"},
    {4, "integer_util", "integer activity", "%"},
    {5, "any_tensor_util", "tensor activity", "%"},
    {6, "dfma_tensor_util", "DFMA tensor activity", "%"},
    {7, "hmma_tensor_util", "HMMA tensor activity", "%"},
    {8, "dmma_tensor_util", "DMMA tensor activity", "%"},
    {9, "imma_tensor_util", "IMMA tensor activity", "%"},
    {10, "dram_bw_util", "DRAM bandwidth utilization", "%"},
    {11, "fp64_util", "FP64 activity", "%"},
    {12, "fp32_util", "FP32 activity", "%"},
    {13, "fp16_util", "FP16 activity", "%"},
    {20, "pcie_tx", "PCIe transmit bandwidth", "MiB/sec"},
    {21, "pcie_rx", "PCIe receive bandwidth", "MiB/sec"},
    {60, "nvlink_total_rx", "NVLink read bandwidth, all links", "MiB/sec"},
    {61, "nvlink_total_tx", "NVLink write bandwidth, all links", "MiB/sec"},
};

static void describe(nvmlGpmMetric_t *m)
{
    m->metricInfo = (nvmlGpmMetricMetricInfo_t){NULL, NULL, NULL};
    for (size_t i = 0; i < sizeof k_metric_info / sizeof k_metric_info[0]; i++) {
        if (k_metric_info[i].id == m->metricId) {
            /* NVML hands out pointers to its own constant strings; callers never write them. */
            m->metricInfo.shortName = (char *)(uintptr_t)k_metric_info[i].short_name;
            m->metricInfo.longName = (char *)(uintptr_t)k_metric_info[i].long_name;
            m->metricInfo.unit = (char *)(uintptr_t)k_metric_info[i].unit;
            return;
        }
    }
    if (m->metricId >= 62 && m->metricId <= 97) /* per-link NVLink bandwidth */
        m->metricInfo.unit = (char *)(uintptr_t)"MiB/sec";
}

NVML_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    if (!vgpu_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (metricsGet == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct nvmlGpmSample_st *s1 = find_sample(metricsGet->sample1, 0);
    const struct nvmlGpmSample_st *s2 = find_sample(metricsGet->sample2, 0);
    if (s1 == NULL || s2 == NULL || !s1->taken || !s2->taken || s1->gpu != s2->gpu || s1->mig != s2->mig ||
        s2->order <= s1->order)
        return NVML_ERROR_INVALID_ARGUMENT; /* a pair of samples of one device, in the order taken */
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        unsigned int id = m->metricId;
        describe(m);
        if (id < VGPU_GPM_SLOTS && (s2->gpm.supported[id / 64] >> (id % 64)) & 1) {
            m->nvmlReturn = NVML_SUCCESS;
            m->value = s2->gpm.value[id];
        } else {
            m->nvmlReturn = id < NVML_GPM_METRIC_MAX ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
            m->value = 0.0;
        }
    }
    return NVML_SUCCESS;
}
