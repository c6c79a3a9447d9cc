/*
 * The state file: what the simulator's Python writer (exporter/vgpu/state.py)
 * publishes and this library maps read-only. vgpu/README.md documents it for both sides.
 * The record's scalar members are generated (scalars.h, from exporter/vgpu/layout.py,
 * by tools/gen_vgpu_layout.py), and so is VGPU_LAYOUT_VERSION: the CRC-32 of that table and of
 * this file, so any change here is a new version; rerun the generator after editing it.
 *
 * Fixed layout, little-endian, natural alignment with no implicit padding (the static
 * asserts at the end pin every size), and a fixed total size: the file never grows or
 * shrinks, so a mapping of it stays valid for as long as the file exists.
 *
 *   [header, 256 bytes][VGPU_MAX_GPUS GPU records][VGPU_EVENT_CAPACITY event slots]
 *
 * Consistency: the header's `seq` is a seqlock, odd while the writer is inside a write. A
 * reader copies what it needs between two reads of `seq` and keeps the copy only if both
 * reads are equal and even. Python cannot issue memory fences, so on weakly ordered CPUs
 * the writer's stores may become visible out of order; each section therefore also carries
 * a CRC-32 of its bytes, checked after the copy, which catches what the seqlock would miss.
 */
#ifndef VGPU_STATE_H
#define VGPU_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "scalars.h"

#define VGPU_MAGIC "GTVGPUST"

#define VGPU_MAX_GPUS 64
#define VGPU_MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS */
#define VGPU_NO_INSTANCE 0xFFFFFFFFu /* an event's gpuInstanceId / computeInstanceId: the whole device (nvml.h) */
#define VGPU_MAX_MIG 7
#define VGPU_MAX_PROCS 32
#define VGPU_MAX_OVERRIDES 16
#define VGPU_MAX_RETIRED 16
#define VGPU_GPM_SLOTS 128 /* GPM metric ids 0..127 can carry a value */
#define VGPU_EVENT_CAPACITY 256
#define VGPU_FIELD_MASK_WORDS 8 /* field ids 0..511 */
#define VGPU_MAX_MIG_PROFILES 16 /* GPU instance profiles (NVML_GPU_INSTANCE_PROFILE_COUNT is 0x12) */
#define VGPU_CLOCK_EVENT_COUNTERS 8

/* Per-GPU fault flags. */
#define VGPU_F_LOST (1u << 0)           /* every device call: NVML_ERROR_GPU_IS_LOST */
#define VGPU_F_HUNG (1u << 1)           /* device calls block until cleared, or the header's hang_max_ms */
#define VGPU_F_INVALID_HANDLE (1u << 2) /* device calls: NVML_ERROR_INVALID_ARGUMENT (a stale handle) */

/* Process kinds (vgpu_proc.kinds). */
#define VGPU_PROC_COMPUTE (1u << 0)
#define VGPU_PROC_GRAPHICS (1u << 1)

/* Bits of vgpu_gpu.unsupported: queries that answer NVML_ERROR_NOT_SUPPORTED on this GPU. */
enum vgpu_query {
    VGPU_Q_UTILIZATION = 0,
    VGPU_Q_MEMORY = 1,
    VGPU_Q_BAR1 = 2,
    VGPU_Q_POWER_USAGE = 3,
    VGPU_Q_ENERGY = 4,
    VGPU_Q_POWER_LIMIT = 5,
    VGPU_Q_TEMPERATURE = 6,
    VGPU_Q_TEMPERATURE_THRESHOLD = 7,
    VGPU_Q_CLOCKS = 8,
    VGPU_Q_CLOCK_EVENT_REASONS = 9,
    VGPU_Q_PERFORMANCE_STATE = 10,
    VGPU_Q_PCIE_THROUGHPUT = 11,
    VGPU_Q_PCIE_LINK = 12,
    VGPU_Q_PCIE_REPLAY = 13,
    VGPU_Q_ECC = 14,
    VGPU_Q_REMAPPED_ROWS = 15,
    VGPU_Q_RETIRED_PAGES = 16,
    VGPU_Q_FAN_SPEED = 17,
    VGPU_Q_COMPUTE_MODE = 18,
    VGPU_Q_PERSISTENCE_MODE = 19,
    VGPU_Q_DISPLAY = 20,
    VGPU_Q_PROCESSES = 21,
    VGPU_Q_EVENTS = 22,
    VGPU_Q_MIG = 23,
    VGPU_Q_GPM = 24,
    VGPU_Q_NVLINK = 25,
    VGPU_Q_FIELD_VALUES = 26,
    VGPU_Q_SERIAL = 27,
    VGPU_Q_BOARD_PART_NUMBER = 28,
    VGPU_Q_VBIOS_VERSION = 29,
    VGPU_Q_INFOROM_VERSION = 30,
    VGPU_Q_ENCODER_DECODER = 31,
    VGPU_Q_FABRIC = 32,
    VGPU_Q_GSP_FIRMWARE = 33,
    VGPU_Q_MIG_PROFILES = 34,
};

struct vgpu_header {
    /* Written once when the file is created; not covered by seq or crc. */
    char magic[8];
    uint32_t layout_version;
    uint32_t header_size;
    uint32_t gpu_size;
    uint32_t max_gpus;
    uint32_t event_capacity;
    uint32_t file_size;
    uint64_t seq;
    /* Covered by seq and by crc, which is the CRC-32 of the bytes from event_total on. */
    uint32_t crc;
    uint32_t reserved0;
    uint64_t event_total; /* events ever published; event n (1-based) sits in slot (n-1) % capacity */
    uint32_t gpu_count;
    uint32_t hang_max_ms;
    int32_t cuda_driver_version; /* 1000 * major + 10 * minor */
    uint32_t reserved1;
    char driver_version[80];
    char nvml_version[80];
    uint8_t reserved2[24];
};

struct vgpu_link {
    uint64_t replay_errors;
    uint64_t recovery_errors;
    uint64_t crc_flit_errors;
    uint64_t crc_data_errors;
    uint64_t ecc_data_errors;
    uint64_t data_tx_kib; /* throughput counters, KiB since the driver loaded */
    uint64_t data_rx_kib;
    uint64_t raw_tx_kib;
    uint64_t raw_rx_kib;
    uint32_t state; /* NVML_NVLINK_STATE_* */
    uint32_t speed_mbps;
};

struct vgpu_proc {
    uint64_t used_memory; /* bytes; NVML_VALUE_NOT_AVAILABLE_ULL when unknown */
    uint32_t pid;
    uint32_t gpu_instance_id;
    uint32_t compute_instance_id;
    uint32_t kinds; /* VGPU_PROC_* */
};

/* A field the writer answers itself, with any value type and any return code. */
struct vgpu_field_override {
    uint64_t value; /* the bits of the nvmlValue_t member that value_type names */
    uint32_t field_id;
    uint32_t scope_id;
    uint32_t value_type;
    uint32_t nvml_return;
};

struct vgpu_gpm {
    uint64_t supported[VGPU_GPM_SLOTS / 64]; /* bit i: metric id i has a value */
    double value[VGPU_GPM_SLOTS];            /* in the unit the metric id documents */
};

struct vgpu_mig {
    uint64_t memory_total;
    uint64_t memory_reserved;
    uint64_t memory_used;
    uint32_t gpu_instance_id;
    uint32_t compute_instance_id;
    char name[96];
    char uuid[96];
    struct vgpu_gpm gpm;
};

/* The NVLink5 (Blackwell) link counters, NVML_FI_DEV_NVLINK_COUNT_*, which replace fields 161-163 there. */
struct vgpu_link_counts {
    uint64_t recovery_successful; /* 213: up -> recovery -> up */
    uint64_t recovery_failed;     /* 214: up -> recovery -> declared down */
    uint64_t recovery_events;     /* 215: up -> recovery, whatever the outcome */
    uint64_t effective_errors;    /* 219 */
    uint64_t symbol_errors;       /* 221 */
};

/* One GPU instance profile, as nvmlDeviceGetGpuInstanceProfileInfoV answers it. */
struct vgpu_mig_profile {
    uint32_t profile; /* NVML_GPU_INSTANCE_PROFILE_* index the caller asks by */
    uint32_t id;
    uint32_t slices;
    uint32_t instances;
    uint32_t sms;
    uint32_t copy_engines;
    uint32_t decoders;
    uint32_t encoders;
    uint32_t jpegs;
    uint32_t ofas;
    uint64_t memory_mb; /* MiB, as the header's "MBytes" means */
    char name[96];      /* "MIG 1g.18gb" */
};

/* A MIG device's nvmlDeviceAttributes_t. */
struct vgpu_mig_attributes {
    uint32_t sms;
    uint32_t copy_engines;
    uint32_t decoders;
    uint32_t encoders;
    uint32_t jpegs;
    uint32_t ofas;
    uint32_t gpu_instance_slices;
    uint32_t compute_instance_slices;
    uint64_t memory_mb;
};

/* What layout 3 added to a GPU's record, with room to grow without another layout change. */
struct vgpu_more {
    uint64_t pcie_tx_bytes; /* NVML_FI_DEV_PCIE_COUNT_TX_BYTES (197): wraps where the writer lets it */
    uint64_t pcie_rx_bytes; /* 198 */
    uint64_t pcie_errors[11]; /* NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS (173) .. _LANE_ERROR (183) */
    /* Clock-event (throttle) durations in ns, by field: 74 SW power cap, 76 sync boost,
     * 269 SW thermal, 270 HW thermal, 271 HW power brake; the rest unused. */
    uint64_t clock_event_ns[VGPU_CLOCK_EVENT_COUNTERS];
    uint32_t pcie_l0_recovery; /* NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER (169) */
    uint32_t power_instant_mw; /* NVML_FI_DEV_POWER_INSTANT (186) */
    uint32_t reset_generation; /* counts completed resets: MIG handles from before one answer INVALID_ARGUMENT */
    uint32_t fabric_state;     /* NVML_GPU_FABRIC_STATE_*; 0 (not supported): the query answers NOT_SUPPORTED */
    uint32_t fabric_status;    /* nvmlReturn_t of the fabric probe */
    uint32_t fabric_clique;
    uint32_t fabric_health_mask;
    uint32_t fabric_health_summary; /* NVML_GPU_FABRIC_HEALTH_SUMMARY_* (v3) */
    uint8_t fabric_cluster_uuid[16];
    uint32_t gsp_enabled; /* nvmlDeviceGetGspFirmwareMode */
    uint32_t gsp_default;
    uint32_t mig_profile_count;
    uint32_t reserved0;
    struct vgpu_mig_attributes mig_attributes[VGPU_MAX_MIG]; /* by MIG slot */
    struct vgpu_mig_profile mig_profiles[VGPU_MAX_MIG_PROFILES];
    struct vgpu_link_counts link_counts[VGPU_MAX_LINKS];
    uint8_t reserved[1888];
};

struct vgpu_gpu {
    uint32_t crc; /* CRC-32 of the rest of this record */
    uint32_t flags;
    uint64_t unsupported;                               /* bit per enum vgpu_query */
    uint64_t unsupported_fields[VGPU_FIELD_MASK_WORDS]; /* bit per NVML field id */
    uint64_t supported_events;
    uint64_t memory_total; /* bytes */
    uint64_t memory_reserved;
    uint64_t memory_used;
    uint64_t bar1_total;
    uint64_t bar1_used;
    uint64_t energy_mj;
    uint64_t clocks_event_reasons;
    uint64_t ecc[2][2][8]; /* [nvmlMemoryErrorType][nvmlEccCounterType][nvmlMemoryLocation] */
    uint64_t retired_address[2][VGPU_MAX_RETIRED]; /* [nvmlPageRetirementCause] */
    uint64_t retired_timestamp[2][VGPU_MAX_RETIRED];
    VGPU_GPU_SCALARS /* retired_count .. reserved0 (scalars.h) */
    char name[96];
    char uuid[96];
    char serial[32];
    char board_part_number[80];
    char vbios_version[32];
    char inforom_image_version[16];
    struct vgpu_link links[VGPU_MAX_LINKS];
    struct vgpu_proc procs[VGPU_MAX_PROCS];
    struct vgpu_field_override overrides[VGPU_MAX_OVERRIDES];
    struct vgpu_gpm gpm;
    struct vgpu_mig mig[VGPU_MAX_MIG];
    struct vgpu_more more;
};

struct vgpu_event {
    uint64_t seq; /* n of "event n"; a slot whose seq differs was overwritten */
    uint64_t event_type;
    uint64_t event_data;
    uint32_t gpu;
    uint32_t gpu_instance_id;
    uint32_t compute_instance_id;
    uint32_t crc; /* CRC-32 of the bytes before it */
};

/* The whole file. */
struct vgpu_image {
    struct vgpu_header header;
    struct vgpu_gpu gpus[VGPU_MAX_GPUS];
    struct vgpu_event events[VGPU_EVENT_CAPACITY];
};

#define VGPU_FILE_SIZE sizeof(struct vgpu_image)

_Static_assert(sizeof(struct vgpu_header) == 256, "header size");
_Static_assert(offsetof(struct vgpu_header, seq) == 32, "seq offset");
_Static_assert(offsetof(struct vgpu_header, event_total) == 48, "header crc start");
_Static_assert(sizeof(struct vgpu_link) == 80, "link size");
_Static_assert(sizeof(struct vgpu_proc) == 24, "proc size");
_Static_assert(sizeof(struct vgpu_field_override) == 24, "override size");
_Static_assert(sizeof(struct vgpu_gpm) == 1040, "gpm size");
_Static_assert(sizeof(struct vgpu_mig) == 1264, "mig size");
_Static_assert(offsetof(struct vgpu_gpu, retired_count) == VGPU_GPU_SCALARS_OFFSET, "gpu scalars offset");
_Static_assert(offsetof(struct vgpu_gpu, name) == VGPU_GPU_SCALARS_OFFSET + VGPU_GPU_SCALARS_SIZE, "gpu scalars");
_Static_assert(offsetof(struct vgpu_gpu, name) == 1232, "gpu scalars size");
_Static_assert(offsetof(struct vgpu_gpu, links) == 1584, "gpu strings size");
_Static_assert(offsetof(struct vgpu_gpu, more) == 15504, "gpu record before layout 3");
_Static_assert(sizeof(struct vgpu_link_counts) == 40, "link counts size");
_Static_assert(sizeof(struct vgpu_mig_profile) == 144, "MIG profile size");
_Static_assert(sizeof(struct vgpu_mig_attributes) == 40, "MIG attributes size");
_Static_assert(sizeof(struct vgpu_more) == 6144, "more size");
_Static_assert(sizeof(struct vgpu_gpu) == 21648, "gpu size");

_Static_assert(sizeof(struct vgpu_event) == 40, "event size");
_Static_assert(VGPU_FILE_SIZE == 256 + 64 * 21648 + 256 * 40, "no padding between sections");

#endif
