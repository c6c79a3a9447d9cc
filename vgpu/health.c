/* Memory health (ECC, row remapping, page retirement) and the NVLink queries. */
#include <string.h>

#include "internal.h"

uint64_t vgpu_ecc_total(const struct vgpu_gpu *g, unsigned int error_type, unsigned int counter_type)
{
    uint64_t sum = 0;
    for (unsigned int loc = 0; loc < NVML_MEMORY_LOCATION_COUNT; loc++)
        sum += g->ecc[error_type][counter_type][loc];
    return sum;
}

int vgpu_remap_blocked(const struct vgpu_gpu *g)
{
    /* The header: with MIG instances active, the row remapper cannot be queried. */
    return g->mig_mode == NVML_DEVICE_MIG_ENABLE && g->mig_count > 0;
}

/* -- ECC ------------------------------------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                              nvmlEnableState_t *pending)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, current != NULL && pending != NULL, VGPU_Q_ECC, 0, &c);
    if (ret == NVML_SUCCESS) {
        *current = c.rec.ecc_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
        *pending = c.rec.ecc_mode_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    }
    return ret;
}

#define ALL_LOCATIONS (-1)

static nvmlReturn_t ecc_counter(nvmlDevice_t device, unsigned int error_type, unsigned int counter_type, int location,
                                unsigned long long *count)
{
    struct vgpu_call c;
    int args_ok = count != NULL && error_type < NVML_MEMORY_ERROR_TYPE_COUNT &&
                  counter_type < NVML_ECC_COUNTER_TYPE_COUNT && location >= ALL_LOCATIONS &&
                  location < NVML_MEMORY_LOCATION_COUNT;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_ECC, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!c.rec.ecc_mode)
        return NVML_ERROR_NOT_SUPPORTED; /* the counters need ECC enabled */
    *count = location == ALL_LOCATIONS ? vgpu_ecc_total(&c.rec, error_type, counter_type)
                                       : c.rec.ecc[error_type][counter_type][location];
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                     nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    return ecc_counter(device, errorType, counterType, ALL_LOCATIONS, eccCounts);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                         nvmlEccCounterType_t counterType,
                                                         nvmlMemoryLocation_t locationType, unsigned long long *count)
{
    unsigned int loc = (unsigned int)locationType;
    return ecc_counter(device, errorType, counterType, loc < NVML_MEMORY_LOCATION_COUNT ? (int)loc : INT_MAX, count);
}

/* -- row remapping and page retirement ------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                                   unsigned int *isPending, unsigned int *failureOccurred)
{
    struct vgpu_call c;
    int args_ok = corrRows != NULL && uncRows != NULL && isPending != NULL && failureOccurred != NULL;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_REMAPPED_ROWS, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (vgpu_remap_blocked(&c.rec))
        return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = c.rec.remapped_correctable;
    *uncRows = c.rec.remapped_uncorrectable;
    *isPending = c.rec.remap_pending;
    *failureOccurred = c.rec.remap_failure;
    return NVML_SUCCESS;
}

/* pageCount in, the buffers' capacity; out, the number of pages. A capacity of 0 asks for the
 * count alone, which is why NULL buffers are accepted then. */
static nvmlReturn_t retired_pages(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                  unsigned long long *addresses, unsigned long long *timestamps, int want_timestamps)
{
    struct vgpu_call c;
    int args_ok = pageCount != NULL && cause < NVML_PAGE_RETIREMENT_CAUSE_COUNT;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_RETIRED_PAGES, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    unsigned int n = c.rec.retired_count[cause];
    if (*pageCount < n) {
        *pageCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && (addresses == NULL || (want_timestamps && timestamps == NULL)))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n; i++) {
        addresses[i] = c.rec.retired_address[cause][i];
        if (want_timestamps)
            timestamps[i] = c.rec.retired_timestamp[cause][i];
    }
    *pageCount = n;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                   unsigned int *pageCount, unsigned long long *addresses)
{
    return retired_pages(device, cause, pageCount, addresses, NULL, 0);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                      unsigned int *pageCount, unsigned long long *addresses,
                                                      unsigned long long *timestamps)
{
    return retired_pages(device, cause, pageCount, addresses, timestamps, 1);
}

GETTER(nvmlDeviceGetRetiredPagesPendingStatus, nvmlEnableState_t, VGPU_Q_RETIRED_PAGES,
       c.rec.retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED)

/* -- NVLink ---------------------------------------------------------------------------------- */

uint64_t vgpu_link_error(const struct vgpu_link *l, unsigned int counter)
{
    switch (counter) {
    case NVML_NVLINK_ERROR_DL_REPLAY: return l->replay_errors;
    case NVML_NVLINK_ERROR_DL_RECOVERY: return l->recovery_errors;
    case NVML_NVLINK_ERROR_DL_CRC_FLIT: return l->crc_flit_errors;
    case NVML_NVLINK_ERROR_DL_CRC_DATA: return l->crc_data_errors;
    default: return l->ecc_data_errors;
    }
}

static nvmlReturn_t link_of(nvmlDevice_t device, int args_ok, unsigned int link, struct vgpu_call *c)
{
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_NVLINK, 0, c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (c->rec.nvlink_count == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    return link < c->rec.nvlink_count ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    struct vgpu_call c;
    nvmlReturn_t ret = link_of(device, isActive != NULL, link, &c);
    if (ret == NVML_SUCCESS) /* a sleeping link is trained and up; only an inactive one is down */
        *isActive = c.rec.links[link].state == NVML_NVLINK_STATE_INACTIVE ? NVML_FEATURE_DISABLED
                                                                           : NVML_FEATURE_ENABLED;
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    struct vgpu_call c;
    nvmlReturn_t ret = link_of(device, version != NULL, link, &c);
    if (ret == NVML_SUCCESS)
        *version = c.rec.nvlink_version;
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                         nvmlNvLinkErrorCounter_t counter,
                                                         unsigned long long *counterValue)
{
    struct vgpu_call c;
    int args_ok = counterValue != NULL && (unsigned int)counter < NVML_NVLINK_ERROR_COUNT;
    nvmlReturn_t ret = link_of(device, args_ok, link, &c);
    if (ret == NVML_SUCCESS)
        *counterValue = vgpu_link_error(&c.rec.links[link], counter);
    return ret;
}
