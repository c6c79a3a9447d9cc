/*
 * nvmlDeviceGetFieldValues: each field answered from one snapshot of the GPU, with its own
 * return code. In order: the writer's per-field overrides (any value type, any return code),
 * then its "not supported" field mask, then the table below. Ids outside the table answer
 * NVML_ERROR_NOT_SUPPORTED, as an older driver answers ids it does not know.
 */
#define _POSIX_C_SOURCE 200809L

#include <string.h>
#include <time.h>

#include "internal.h"

/* Which query kind gates a field: a GPU that cannot answer the API cannot answer its field. */
#define GATE(query)                                                                                                   \
    do {                                                                                                              \
        if (vgpu_query_unsupported(g, query))                                                                         \
            return NVML_ERROR_NOT_SUPPORTED;                                                                          \
    } while (0)

static nvmlReturn_t put_uint(nvmlFieldValue_t *v, uint64_t x)
{
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.uiVal = (unsigned int)x;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_ull(nvmlFieldValue_t *v, uint64_t x)
{
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = x;
    return NVML_SUCCESS;
}

/* NVML_FI_DEV_ECC_SBE_VOL_L1 (7) to NVML_FI_DEV_ECC_DBE_AGG_CBU (28): error type, counter
 * type, location. CBU has no corrected counter. */
static const unsigned char k_ecc_fields[22][3] = {
    {0, 0, 0}, {1, 0, 0}, {0, 0, 1}, {1, 0, 1}, {0, 0, 2}, {1, 0, 2}, {0, 0, 3}, {1, 0, 3},
    {0, 0, 4}, {1, 0, 4}, {1, 0, 6}, {0, 1, 0}, {1, 1, 0}, {0, 1, 1}, {1, 1, 1}, {0, 1, 2},
    {1, 1, 2}, {0, 1, 3}, {1, 1, 3}, {0, 1, 4}, {1, 1, 4}, {1, 1, 6},
};

/* The legacy per-link ids: a run of ids for consecutive links, or (count 0) a sum over links. */
#define SPEED (-1)
static const struct {
    unsigned int first_id, first_link, count;
    int counter; /* nvmlNvLinkErrorCounter_t, or SPEED */
} k_link_fields[] = {
    {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, 0, 6, NVML_NVLINK_ERROR_DL_CRC_FLIT},
    {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0 + 6, 0, 0, NVML_NVLINK_ERROR_DL_CRC_FLIT},
    {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, 6, 6, NVML_NVLINK_ERROR_DL_CRC_FLIT},
    {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, 0, 6, NVML_NVLINK_ERROR_DL_CRC_DATA},
    {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 + 6, 0, 0, NVML_NVLINK_ERROR_DL_CRC_DATA},
    {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, 6, 6, NVML_NVLINK_ERROR_DL_CRC_DATA},
    {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, 0, 6, NVML_NVLINK_ERROR_DL_REPLAY},
    {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0 + 6, 0, 0, NVML_NVLINK_ERROR_DL_REPLAY},
    {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, 6, 6, NVML_NVLINK_ERROR_DL_REPLAY},
    {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, 0, 6, NVML_NVLINK_ERROR_DL_RECOVERY},
    {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0 + 6, 0, 0, NVML_NVLINK_ERROR_DL_RECOVERY},
    {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, 6, 6, NVML_NVLINK_ERROR_DL_RECOVERY},
    {NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L0, 0, 12, NVML_NVLINK_ERROR_DL_ECC_DATA},
    {NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL, 0, 0, NVML_NVLINK_ERROR_DL_ECC_DATA},
    {NVML_FI_DEV_NVLINK_SPEED_MBPS_L0, 0, 6, SPEED},
    {NVML_FI_DEV_NVLINK_SPEED_MBPS_L6, 6, 6, SPEED},
};

static nvmlReturn_t legacy_link_field(const struct vgpu_gpu *g, unsigned int id, nvmlFieldValue_t *v, int *matched)
{
    for (size_t i = 0; i < sizeof k_link_fields / sizeof k_link_fields[0]; i++) {
        unsigned int first = k_link_fields[i].first_id, count = k_link_fields[i].count;
        if (count == 0 ? id != first : (id < first || id >= first + count))
            continue;
        *matched = 1;
        GATE(VGPU_Q_NVLINK);
        int counter = k_link_fields[i].counter;
        if (count == 0) {
            uint64_t sum = 0;
            for (unsigned int l = 0; l < g->nvlink_count; l++)
                sum += vgpu_link_error(&g->links[l], (unsigned int)counter);
            return put_ull(v, sum);
        }
        unsigned int link = k_link_fields[i].first_link + (id - first);
        if (link >= g->nvlink_count)
            return NVML_ERROR_NOT_SUPPORTED;
        if (counter == SPEED)
            return put_uint(v, g->links[link].speed_mbps);
        return put_ull(v, vgpu_link_error(&g->links[link], (unsigned int)counter));
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

static int blackwell_or_later(const struct vgpu_gpu *g)
{
    return g->architecture >= NVML_DEVICE_ARCH_BLACKWELL && g->architecture != 0xFFFFFFFFu;
}

/* The NVLink5 counters, scoped by link: answered from Blackwell on, NOT_SUPPORTED before. */
static nvmlReturn_t link_count_field(const struct vgpu_gpu *g, unsigned int id, unsigned int link,
                                     nvmlFieldValue_t *v)
{
    GATE(VGPU_Q_NVLINK);
    if (!blackwell_or_later(g))
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= g->nvlink_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct vgpu_link_counts *k = &g->more.link_counts[link];
    switch (id) {
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS: return put_ull(v, k->recovery_successful);
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS: return put_ull(v, k->recovery_failed);
    case NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS: return put_ull(v, k->recovery_events);
    case NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: return put_ull(v, k->effective_errors);
    default: return put_ull(v, k->symbol_errors);
    }
}

/* Fields scoped by link id (scopeId); the throughput ones also take UINT_MAX for all links. */
static nvmlReturn_t scoped_link_field(const struct vgpu_gpu *g, unsigned int id, unsigned int link,
                                      nvmlFieldValue_t *v)
{
    GATE(VGPU_Q_NVLINK);
    /* The header, on 161-163: "This is unsupported for Blackwell+. Please use
     * NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*". */
    if (id >= NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY && id <= NVML_FI_DEV_NVLINK_ERROR_DL_CRC && blackwell_or_later(g))
        return NVML_ERROR_NOT_SUPPORTED;
    int throughput = id >= NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX && id <= NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX;
    if (throughput && link == UINT_MAX) {
        uint64_t sum = 0;
        for (unsigned int l = 0; l < g->nvlink_count; l++) {
            const struct vgpu_link *k = &g->links[l];
            const uint64_t by_id[4] = {k->data_tx_kib, k->data_rx_kib, k->raw_tx_kib, k->raw_rx_kib};
            sum += by_id[id - NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX];
        }
        return put_ull(v, sum);
    }
    if (link >= g->nvlink_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct vgpu_link *k = &g->links[link];
    switch (id) {
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: return put_ull(v, k->data_tx_kib);
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: return put_ull(v, k->data_rx_kib);
    case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: return put_ull(v, k->raw_tx_kib);
    case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: return put_ull(v, k->raw_rx_kib);
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: return put_ull(v, k->replay_errors);
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: return put_ull(v, k->recovery_errors);
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC: return put_ull(v, k->crc_flit_errors);
    case NVML_FI_DEV_NVLINK_GET_SPEED: return put_uint(v, k->speed_mbps);
    case NVML_FI_DEV_NVLINK_GET_STATE: return put_uint(v, k->state);
    default: return put_uint(v, g->nvlink_version);
    }
}

/* Power fields take a scope: 0 is the GPU; the module (1) and GPU-base (2) scopes exist on
 * Grace-based boards only. */
static nvmlReturn_t power_field(const struct vgpu_gpu *g, unsigned int id, unsigned int scope, nvmlFieldValue_t *v)
{
    if (scope > 2)
        return NVML_ERROR_INVALID_ARGUMENT;
    GATE(id == NVML_FI_DEV_ENERGY ? VGPU_Q_ENERGY
         : id <= NVML_FI_DEV_POWER_INSTANT ? VGPU_Q_POWER_USAGE
                                           : VGPU_Q_POWER_LIMIT);
    if (scope != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    switch (id) {
    case NVML_FI_DEV_POWER_AVERAGE: return put_uint(v, g->power_mw);
    case NVML_FI_DEV_POWER_INSTANT: return put_uint(v, g->more.power_instant_mw);
    case NVML_FI_DEV_POWER_MIN_LIMIT: return put_uint(v, g->power_limit_min_mw);
    case NVML_FI_DEV_POWER_MAX_LIMIT: return put_uint(v, g->power_limit_max_mw);
    case NVML_FI_DEV_POWER_DEFAULT_LIMIT: return put_uint(v, g->power_limit_default_mw);
    case NVML_FI_DEV_POWER_CURRENT_LIMIT: return put_uint(v, g->power_limit_enforced_mw);
    case NVML_FI_DEV_ENERGY: return put_ull(v, g->energy_mj);
    default: return put_uint(v, g->power_limit_mw); /* requested limit */
    }
}

static nvmlReturn_t answer(const struct vgpu_gpu *g, nvmlFieldValue_t *v)
{
    unsigned int id = v->fieldId, scope = v->scopeId;
    if (id >= NVML_FI_DEV_ECC_CURRENT && id <= NVML_FI_DEV_ECC_DBE_AGG_CBU) {
        GATE(VGPU_Q_ECC);
        if (id == NVML_FI_DEV_ECC_CURRENT)
            return put_uint(v, g->ecc_mode);
        if (id == NVML_FI_DEV_ECC_PENDING)
            return put_uint(v, g->ecc_mode_pending);
        if (!g->ecc_mode)
            return NVML_ERROR_NOT_SUPPORTED;
        if (id <= NVML_FI_DEV_ECC_DBE_AGG_TOTAL) /* SBE/DBE x volatile/aggregate */
            return put_ull(v, vgpu_ecc_total(g, (id - 3) % 2, (id - 3) / 2));
        const unsigned char *e = k_ecc_fields[id - NVML_FI_DEV_ECC_SBE_VOL_L1];
        return put_ull(v, g->ecc[e[0]][e[1]][e[2]]);
    }
    switch (id) {
    case NVML_FI_DEV_RETIRED_SBE:
    case NVML_FI_DEV_RETIRED_DBE:
        GATE(VGPU_Q_RETIRED_PAGES);
        return put_ull(v, g->retired_count[id - NVML_FI_DEV_RETIRED_SBE]);
    case NVML_FI_DEV_RETIRED_PENDING:
    case NVML_FI_DEV_RETIRED_PENDING_SBE:
    case NVML_FI_DEV_RETIRED_PENDING_DBE: GATE(VGPU_Q_RETIRED_PAGES); return put_uint(v, g->retired_pending);
    case NVML_FI_DEV_MEMORY_TEMP: GATE(VGPU_Q_TEMPERATURE); return put_uint(v, (uint32_t)g->temperature_memory);
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: GATE(VGPU_Q_ENERGY); return put_ull(v, g->energy_mj);
    case NVML_FI_DEV_NVLINK_LINK_COUNT: GATE(VGPU_Q_NVLINK); return put_uint(v, g->nvlink_count);
    case NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
        GATE(VGPU_Q_NVLINK);
        for (unsigned int l = 0; l < g->nvlink_count; l++)
            if (g->links[l].state != NVML_NVLINK_STATE_INACTIVE)
                return put_uint(v, g->links[l].speed_mbps);
        return NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: GATE(VGPU_Q_PCIE_REPLAY); return put_uint(v, g->pcie_replay);
    case NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: GATE(VGPU_Q_PCIE_REPLAY); return put_uint(v, 0);
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE: {
        GATE(VGPU_Q_REMAPPED_ROWS);
        if (vgpu_remap_blocked(g))
            return NVML_ERROR_NOT_SUPPORTED;
        const uint32_t by_id[4] = {g->remapped_correctable, g->remapped_uncorrectable, g->remap_pending,
                                   g->remap_failure};
        return put_uint(v, by_id[id - NVML_FI_DEV_REMAPPED_COR]);
    }
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: return put_uint(v, g->recovery_action);
    case NVML_FI_DEV_PERF_POLICY_POWER: GATE(VGPU_Q_CLOCK_EVENT_REASONS); return put_ull(v, g->more.clock_event_ns[0]);
    case NVML_FI_DEV_PERF_POLICY_SYNC_BOOST:
        GATE(VGPU_Q_CLOCK_EVENT_REASONS);
        return put_ull(v, g->more.clock_event_ns[1]);
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN:
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN:
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN:
        GATE(VGPU_Q_CLOCK_EVENT_REASONS);
        return put_ull(v, g->more.clock_event_ns[2 + id - NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN]);
    case NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER: GATE(VGPU_Q_PCIE_REPLAY); return put_uint(v, g->more.pcie_l0_recovery);
    case NVML_FI_DEV_PCIE_COUNT_TX_BYTES: GATE(VGPU_Q_PCIE_THROUGHPUT); return put_ull(v, g->more.pcie_tx_bytes);
    case NVML_FI_DEV_PCIE_COUNT_RX_BYTES: GATE(VGPU_Q_PCIE_THROUGHPUT); return put_ull(v, g->more.pcie_rx_bytes);
    default: break;
    }
    if (id >= NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS && id <= NVML_FI_DEV_PCIE_COUNT_LANE_ERROR) {
        GATE(VGPU_Q_PCIE_REPLAY);
        return put_ull(v, g->more.pcie_errors[id - NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS]);
    }
    if ((id >= NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS &&
         id <= NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS) ||
        id == NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS || id == NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS)
        return link_count_field(g, id, scope, v);
    if ((id >= NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX && id <= NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX) ||
        (id >= NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY && id <= NVML_FI_DEV_NVLINK_GET_VERSION))
        return scoped_link_field(g, id, scope, v);
    if (id >= NVML_FI_DEV_POWER_AVERAGE && id <= NVML_FI_DEV_POWER_REQUESTED_LIMIT)
        return power_field(g, id, scope, v);
    int matched = 0;
    nvmlReturn_t ret = legacy_link_field(g, id, v, &matched);
    return matched ? ret : NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t overridden(const struct vgpu_gpu *g, nvmlFieldValue_t *v, int *found)
{
    for (unsigned int i = 0; i < g->override_count; i++) {
        const struct vgpu_field_override *o = &g->overrides[i];
        if (o->field_id != v->fieldId || o->scope_id != v->scopeId)
            continue;
        *found = 1;
        v->valueType = (nvmlValueType_t)o->value_type;
        switch (o->value_type) { /* only the member the type names is written, as a union allows */
        case NVML_VALUE_TYPE_DOUBLE: memcpy(&v->value.dVal, &o->value, sizeof v->value.dVal); break;
        case NVML_VALUE_TYPE_UNSIGNED_INT: v->value.uiVal = (unsigned int)o->value; break;
        case NVML_VALUE_TYPE_UNSIGNED_LONG: v->value.ulVal = (unsigned long)o->value; break;
        case NVML_VALUE_TYPE_SIGNED_LONG_LONG: v->value.sllVal = (signed long long)o->value; break;
        case NVML_VALUE_TYPE_SIGNED_INT: v->value.siVal = (int)(int64_t)o->value; break;
        case NVML_VALUE_TYPE_UNSIGNED_SHORT: v->value.usVal = (unsigned short)o->value; break;
        default: v->value.ullVal = o->value; break;
        }
        return (nvmlReturn_t)o->nvml_return;
    }
    return NVML_SUCCESS;
}

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    struct vgpu_call c;
    int args_ok = valuesCount >= 0 && (values != NULL || valuesCount == 0);
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_FIELD_VALUES, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    long long stamp = now_us();
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = stamp;
        v->latencyUsec = 0;
        int found = 0;
        v->nvmlReturn = overridden(&c.rec, v, &found);
        if (found)
            continue;
        unsigned int id = v->fieldId;
        if (id < 64 * VGPU_FIELD_MASK_WORDS && (c.rec.unsupported_fields[id / 64] >> (id % 64)) & 1)
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else
            v->nvmlReturn = answer(&c.rec, v);
    }
    return NVML_SUCCESS;
}
