/* Device queries: identity, PCI, memory, utilisation, power, thermals, clocks and modes. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define STRING_GETTER(fn, query, flags, expr, size)                                                                   \
    NVML_EXPORT nvmlReturn_t fn(nvmlDevice_t device, char *out, unsigned int length)                                  \
    {                                                                                                                 \
        struct vgpu_call c;                                                                                           \
        nvmlReturn_t ret = vgpu_begin(device, out != NULL, query, flags, &c);                                         \
        if (ret == NVML_SUCCESS)                                                                                      \
            ret = vgpu_copy_string(out, length, expr, size);                                                          \
        return ret;                                                                                                   \
    }

/* -- identity -------------------------------------------------------------------------------- */

GETTER(nvmlDeviceGetIndex, unsigned int, VGPU_NO_QUERY, c.gpu)
GETTER(nvmlDeviceGetMinorNumber, unsigned int, VGPU_NO_QUERY, c.rec.minor_number)
GETTER(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, VGPU_NO_QUERY, c.rec.architecture)
GETTER(nvmlDeviceGetBrand, nvmlBrandType_t, VGPU_NO_QUERY, c.rec.brand)

/* A MIG device has a name and UUID of its own (the same array sizes as the GPU's). */
STRING_GETTER(nvmlDeviceGetName, VGPU_NO_QUERY, VGPU_ACCEPT_MIG, c.mig < 0 ? c.rec.name : c.rec.mig[c.mig].name,
              sizeof c.rec.name)
STRING_GETTER(nvmlDeviceGetUUID, VGPU_NO_QUERY, VGPU_ACCEPT_MIG, c.mig < 0 ? c.rec.uuid : c.rec.mig[c.mig].uuid,
              sizeof c.rec.uuid)
STRING_GETTER(nvmlDeviceGetSerial, VGPU_Q_SERIAL, 0, c.rec.serial, sizeof c.rec.serial)
STRING_GETTER(nvmlDeviceGetBoardPartNumber, VGPU_Q_BOARD_PART_NUMBER, 0, c.rec.board_part_number,
              sizeof c.rec.board_part_number)
STRING_GETTER(nvmlDeviceGetVbiosVersion, VGPU_Q_VBIOS_VERSION, 0, c.rec.vbios_version, sizeof c.rec.vbios_version)
STRING_GETTER(nvmlDeviceGetInforomImageVersion, VGPU_Q_INFOROM_VERSION, 0, c.rec.inforom_image_version,
              sizeof c.rec.inforom_image_version)

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, major != NULL && minor != NULL, VGPU_NO_QUERY, 0, &c);
    if (ret == NVML_SUCCESS) {
        *major = (int)c.rec.cuda_cc_major;
        *minor = (int)c.rec.cuda_cc_minor;
    }
    return ret;
}

/* -- PCI ------------------------------------------------------------------------------------- */

/* The members that every version of the PCI info struct shares, at the same offsets. */
static void fill_pci_common(const struct vgpu_gpu *g, nvmlPciInfo_t *pci)
{
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", g->pci_domain & 0xFFFF, g->pci_bus & 0xFF,
             g->pci_device & 0xFF);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, pci != NULL, VGPU_NO_QUERY, 0, &c);
    if (ret == NVML_SUCCESS) {
        fill_pci_common(&c.rec, pci);
        snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", c.rec.pci_domain, c.rec.pci_bus & 0xFF,
                 c.rec.pci_device & 0xFF);
    }
    return ret;
}

/* Older callers pass the 52-byte legacy struct, whose tail is reserved: only the shared
 * members are written, never the 32-byte busId that would overrun it. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, pci != NULL, VGPU_NO_QUERY, 0, &c);
    if (ret == NVML_SUCCESS)
        fill_pci_common(&c.rec, pci);
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v2(device, pci);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, pci != NULL, VGPU_NO_QUERY, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (pci->version != nvmlPciInfoExt_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    pci->domain = c.rec.pci_domain;
    pci->bus = c.rec.pci_bus;
    pci->device = c.rec.pci_device;
    pci->pciDeviceId = c.rec.pci_device_id;
    pci->pciSubSystemId = c.rec.pci_subsystem_id;
    pci->baseClass = c.rec.pci_base_class;
    pci->subClass = c.rec.pci_sub_class;
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", c.rec.pci_domain, c.rec.pci_bus & 0xFF,
             c.rec.pci_device & 0xFF);
    return NVML_SUCCESS;
}

GETTER(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int, VGPU_Q_PCIE_LINK, c.rec.pcie_gen)
GETTER(nvmlDeviceGetCurrPcieLinkWidth, unsigned int, VGPU_Q_PCIE_LINK, c.rec.pcie_width)
GETTER(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int, VGPU_Q_PCIE_LINK, c.rec.pcie_gen_max)
GETTER(nvmlDeviceGetMaxPcieLinkWidth, unsigned int, VGPU_Q_PCIE_LINK, c.rec.pcie_width_max)
GETTER(nvmlDeviceGetPcieReplayCounter, unsigned int, VGPU_Q_PCIE_REPLAY, c.rec.pcie_replay)

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                                     unsigned int *value)
{
    struct vgpu_call c;
    int args_ok = value != NULL && (unsigned int)counter < NVML_PCIE_UTIL_COUNT;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_PCIE_THROUGHPUT, 0, &c);
    if (ret == NVML_SUCCESS)
        *value = counter == NVML_PCIE_UTIL_TX_BYTES ? c.rec.pcie_tx_kbs : c.rec.pcie_rx_kbs;
    return ret;
}

/* -- memory and utilisation ------------------------------------------------------------------ */

static void memory_of(const struct vgpu_call *c, uint64_t *total, uint64_t *reserved, uint64_t *used)
{
    if (c->mig < 0) {
        *total = c->rec.memory_total, *reserved = c->rec.memory_reserved, *used = c->rec.memory_used;
    } else {
        const struct vgpu_mig *m = &c->rec.mig[c->mig];
        *total = m->memory_total, *reserved = m->memory_reserved, *used = m->memory_used;
    }
}

static uint64_t free_of(uint64_t total, uint64_t reserved, uint64_t used)
{
    return reserved + used >= total ? 0 : total - reserved - used;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, memory != NULL, VGPU_Q_MEMORY, VGPU_ACCEPT_MIG, &c);
    if (ret == NVML_SUCCESS)
        ret = vgpu_aggregate_allowed(&c);
    if (ret == NVML_SUCCESS) {
        uint64_t total, reserved, used;
        memory_of(&c, &total, &reserved, &used);
        memory->total = total;
        memory->free = free_of(total, reserved, used);
        memory->used = total - memory->free; /* v1 counts the reserved memory as used */
    }
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, memory != NULL, VGPU_Q_MEMORY, VGPU_ACCEPT_MIG, &c);
    if (ret == NVML_SUCCESS)
        ret = vgpu_aggregate_allowed(&c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t total, reserved, used;
    memory_of(&c, &total, &reserved, &used);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = free_of(total, reserved, used);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, bar1 != NULL, VGPU_Q_BAR1, 0, &c);
    if (ret == NVML_SUCCESS) {
        bar1->bar1Total = c.rec.bar1_total;
        bar1->bar1Used = c.rec.bar1_used;
        bar1->bar1Free = c.rec.bar1_used >= c.rec.bar1_total ? 0 : c.rec.bar1_total - c.rec.bar1_used;
    }
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, utilization != NULL, VGPU_Q_UTILIZATION, 0, &c);
    if (ret == NVML_SUCCESS) {
        utilization->gpu = c.rec.util_gpu;
        utilization->memory = c.rec.util_memory;
    }
    return ret;
}

/* The codec engines sample over about a sixth of a second on Hopper. */
#define CODEC_SAMPLING_PERIOD_US 167000u

static nvmlReturn_t codec_utilization(nvmlDevice_t device, int encoder, unsigned int *util, unsigned int *period)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, util != NULL && period != NULL, VGPU_Q_ENCODER_DECODER, 0, &c);
    if (ret == NVML_SUCCESS) {
        *util = encoder ? c.rec.util_encoder : c.rec.util_decoder;
        *period = CODEC_SAMPLING_PERIOD_US;
    }
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                         unsigned int *samplingPeriodUs)
{
    return codec_utilization(device, 1, utilization, samplingPeriodUs);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                         unsigned int *samplingPeriodUs)
{
    return codec_utilization(device, 0, utilization, samplingPeriodUs);
}

/* -- power ----------------------------------------------------------------------------------- */

GETTER(nvmlDeviceGetPowerUsage, unsigned int, VGPU_Q_POWER_USAGE, c.rec.power_mw)
GETTER(nvmlDeviceGetTotalEnergyConsumption, unsigned long long, VGPU_Q_ENERGY, c.rec.energy_mj)
GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, VGPU_Q_POWER_LIMIT, c.rec.power_limit_enforced_mw)
GETTER(nvmlDeviceGetPowerManagementLimit, unsigned int, VGPU_Q_POWER_LIMIT, c.rec.power_limit_mw)
GETTER(nvmlDeviceGetPowerManagementDefaultLimit, unsigned int, VGPU_Q_POWER_LIMIT, c.rec.power_limit_default_mw)
GETTER(nvmlDeviceGetPowerManagementMode, nvmlEnableState_t, VGPU_Q_POWER_LIMIT, NVML_FEATURE_ENABLED)

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit,
                                                                      unsigned int *maxLimit)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, minLimit != NULL && maxLimit != NULL, VGPU_Q_POWER_LIMIT, 0, &c);
    if (ret == NVML_SUCCESS) {
        *minLimit = c.rec.power_limit_min_mw;
        *maxLimit = c.rec.power_limit_max_mw;
    }
    return ret;
}

/* -- thermals -------------------------------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                                  unsigned int *temp)
{
    struct vgpu_call c;
    int args_ok = temp != NULL && sensorType == NVML_TEMPERATURE_GPU;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_TEMPERATURE, 0, &c);
    if (ret == NVML_SUCCESS)
        *temp = (unsigned int)c.rec.temperature_gpu;
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, temperature != NULL, VGPU_Q_TEMPERATURE, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = c.rec.temperature_gpu;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                           nvmlTemperatureThresholds_t thresholdType,
                                                           unsigned int *temp)
{
    struct vgpu_call c;
    int args_ok = temp != NULL && (unsigned int)thresholdType < NVML_TEMPERATURE_THRESHOLD_COUNT;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_TEMPERATURE_THRESHOLD, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (c.rec.temperature_threshold[thresholdType] == 0)
        return NVML_ERROR_NOT_SUPPORTED; /* the acoustic and GPS thresholds, on a data-centre part */
    *temp = c.rec.temperature_threshold[thresholdType];
    return NVML_SUCCESS;
}

GETTER(nvmlDeviceGetFanSpeed, unsigned int, VGPU_Q_FAN_SPEED, c.rec.fan_speed)

/* -- clocks and performance ------------------------------------------------------------------ */

static nvmlReturn_t clock_of(nvmlDevice_t device, unsigned int type, unsigned int id, unsigned int *mhz)
{
    struct vgpu_call c;
    int args_ok = mhz != NULL && type < NVML_CLOCK_COUNT && id < NVML_CLOCK_ID_COUNT;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_CLOCKS, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    const uint32_t *table[NVML_CLOCK_ID_COUNT] = {c.rec.clock_mhz, c.rec.clock_app_mhz, c.rec.clock_app_default_mhz,
                                                  c.rec.clock_max_mhz};
    *mhz = table[id][type];
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType, nvmlClockId_t clockId,
                                            unsigned int *clockMHz)
{
    return clock_of(device, clockType, clockId, clockMHz);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    return clock_of(device, type, NVML_CLOCK_ID_CURRENT, clock);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    return clock_of(device, type, NVML_CLOCK_ID_CUSTOMER_BOOST_MAX, clock);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                        unsigned int *clockMHz)
{
    return clock_of(device, clockType, NVML_CLOCK_ID_APP_CLOCK_TARGET, clockMHz);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                               unsigned int *clockMHz)
{
    return clock_of(device, clockType, NVML_CLOCK_ID_APP_CLOCK_DEFAULT, clockMHz);
}

GETTER(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long, VGPU_Q_CLOCK_EVENT_REASONS,
       c.rec.clocks_event_reasons)
GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long, VGPU_Q_CLOCK_EVENT_REASONS,
       c.rec.clocks_event_reasons)
GETTER(nvmlDeviceGetPerformanceState, nvmlPstates_t, VGPU_Q_PERFORMANCE_STATE, c.rec.pstate)
GETTER(nvmlDeviceGetPowerState, nvmlPstates_t, VGPU_Q_PERFORMANCE_STATE, c.rec.pstate)

/* -- modes ----------------------------------------------------------------------------------- */

GETTER(nvmlDeviceGetComputeMode, nvmlComputeMode_t, VGPU_Q_COMPUTE_MODE, c.rec.compute_mode)
GETTER(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, VGPU_Q_PERSISTENCE_MODE, c.rec.persistence_mode)
GETTER(nvmlDeviceGetDisplayMode, nvmlEnableState_t, VGPU_Q_DISPLAY, c.rec.display_mode)
GETTER(nvmlDeviceGetDisplayActive, nvmlEnableState_t, VGPU_Q_DISPLAY, c.rec.display_active)

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGspFirmwareMode(nvmlDevice_t device, unsigned int *isEnabled,
                                                      unsigned int *defaultMode)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, isEnabled != NULL && defaultMode != NULL, VGPU_Q_GSP_FIRMWARE, 0, &c);
    if (ret == NVML_SUCCESS) {
        *isEnabled = c.rec.more.gsp_enabled;
        *defaultMode = c.rec.more.gsp_default;
    }
    return ret;
}

/* -- fabric (NVSwitch and NVL systems) -------------------------------------------------------- */

/* Takes the v2 struct (what pynvml's c_nvmlGpuFabricInfoV_t is) and the header's v3, which adds the
 * health summary; both start with the same members. A GPU outside any fabric answers NOT_SUPPORTED. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfo_v3_t *info)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, info != NULL, VGPU_Q_FABRIC, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (info->version != nvmlGpuFabricInfo_v2 && info->version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct vgpu_more *m = &c.rec.more;
    if (m->fabric_state == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)
        return NVML_ERROR_NOT_SUPPORTED;
    memcpy(info->clusterUuid, m->fabric_cluster_uuid, sizeof info->clusterUuid);
    info->status = (nvmlReturn_t)m->fabric_status;
    info->cliqueId = m->fabric_clique;
    info->state = (nvmlGpuFabricState_t)m->fabric_state;
    info->healthMask = m->fabric_health_mask;
    if (info->version == nvmlGpuFabricInfo_v3)
        info->healthSummary = (unsigned char)m->fabric_health_summary;
    return NVML_SUCCESS;
}
