/*
 * The node presented when GPU_TRIAGE_VGPU_STATE is unset: eight idle, healthy H100 80GB HBM3
 * (SXM5) GPUs. The Python writer's h100_node() builds the same node, and a test holds the
 * two to each other, so a simulator that starts from h100_node() changes nothing a client
 * can see until it changes a value.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define DEFAULT_GPUS 8

static const char *const k_uuids[DEFAULT_GPUS] = {
    "GPU-87751d4c-a850-4e2c-84dc-da6a797d76de", "GPU-61b339ff-2481-44e5-998b-88dbaa99e079",
    "GPU-7b87a9e2-5fef-4911-bf22-a27b02c7bff2", "GPU-75d0dd66-cf72-4858-a4b6-6f8c462804db",
    "GPU-3a46e6b0-99f9-46b1-9d45-af1cb0caae1c", "GPU-9fcdb9e1-a94c-46b9-806d-2cc78ee58b06",
    "GPU-5e1ea978-70a7-4e49-ba60-dbd625329041", "GPU-35d30d74-e7ed-4867-96f5-47ab298a59f8",
};

/* The PCI buses of a typical 8-GPU HGX H100 board. */
static const unsigned int k_buses[DEFAULT_GPUS] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

#define H100_LINKS 18
#define H100_LINK_MBPS 26562u
#define NVLINK_VERSION_4_0 6u /* nvmlNvlinkVersion_t */
#define ARCH_HOPPER 9u
#define MIB (1024ull * 1024ull)

static void set_bit(uint64_t *words, unsigned int bit)
{
    words[bit / 64] |= 1ull << (bit % 64);
}

/* GPM metric ids an H100 reports: the utilisation family, PCIe, and NVLink total and per link
 * (links 0-17 are ids 62-97). */
static void h100_gpm(struct vgpu_gpm *gpm)
{
    for (unsigned int id = 1; id <= 13; id++)
        set_bit(gpm->supported, id);
    set_bit(gpm->supported, 20);
    set_bit(gpm->supported, 21);
    for (unsigned int id = 60; id <= 97; id++)
        set_bit(gpm->supported, id);
}

static void h100(struct vgpu_gpu *g, unsigned int i)
{
    memset(g, 0, sizeof *g);
    /* An SXM board has no fan of its own, and Hopper replaces page retirement with row
     * remapping: the real driver answers NOT_SUPPORTED to both. */
    g->unsupported = (1ull << VGPU_Q_FAN_SPEED) | (1ull << VGPU_Q_RETIRED_PAGES);
    const unsigned int retired_fields[] = {NVML_FI_DEV_RETIRED_SBE, NVML_FI_DEV_RETIRED_DBE,
                                           NVML_FI_DEV_RETIRED_PENDING, NVML_FI_DEV_RETIRED_PENDING_SBE,
                                           NVML_FI_DEV_RETIRED_PENDING_DBE};
    for (size_t k = 0; k < sizeof retired_fields / sizeof retired_fields[0]; k++)
        set_bit(g->unsupported_fields, retired_fields[k]);
    g->supported_events = nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |
                          nvmlEventTypeXidCriticalError | 0x100 /* nvmlEventMigConfigChange */;

    g->memory_total = 81559 * MIB;
    g->memory_reserved = 567 * MIB;
    g->memory_used = 0;
    g->bar1_total = 131072 * MIB;
    g->bar1_used = 1 * MIB;
    g->energy_mj = 6000000000ull + 7000000ull * i;
    g->clocks_event_reasons = 0x1; /* GPU idle */

    g->minor_number = i;
    g->brand = NVML_BRAND_NVIDIA;
    g->architecture = ARCH_HOPPER;
    g->cuda_cc_major = 9;
    g->cuda_cc_minor = 0;
    g->pci_domain = 0;
    g->pci_bus = k_buses[i];
    g->pci_device = 0;
    g->pci_device_id = 0x233010DEu;
    g->pci_subsystem_id = 0x16C110DEu;
    g->pci_base_class = 0x3; /* display controller */
    g->pci_sub_class = 0x2;  /* 3D controller */

    g->power_mw = 69000 + 500 * i;
    g->power_limit_enforced_mw = 700000;
    g->power_limit_mw = 700000;
    g->power_limit_min_mw = 200000;
    g->power_limit_max_mw = 700000;
    g->power_limit_default_mw = 700000;
    g->temperature_gpu = 30 + (int)(i % 4);
    g->temperature_memory = 28 + (int)(i % 4);
    const unsigned int thresholds[4] = {92, 89, 95, 87}; /* shutdown, slowdown, memory max, GPU max */
    memcpy(g->temperature_threshold, thresholds, sizeof thresholds);
    const unsigned int clocks[4] = {345, 345, 2619, 765}; /* graphics, SM, memory, video */
    const unsigned int max_clocks[4] = {1980, 1980, 2619, 1545};
    const unsigned int app_clocks[4] = {1755, 1755, 2619, 1545};
    memcpy(g->clock_mhz, clocks, sizeof clocks);
    memcpy(g->clock_max_mhz, max_clocks, sizeof max_clocks);
    memcpy(g->clock_app_mhz, app_clocks, sizeof app_clocks);
    memcpy(g->clock_app_default_mhz, app_clocks, sizeof app_clocks);
    g->pstate = 0;
    g->pcie_tx_kbs = 512;
    g->pcie_rx_kbs = 1024;
    g->pcie_gen = 5;
    g->pcie_gen_max = 5;
    g->pcie_width = 16;
    g->pcie_width_max = 16;
    g->ecc_mode = 1;
    g->ecc_mode_pending = 1;
    g->persistence_mode = 1;
    g->mig_max = 7;
    g->nvlink_count = H100_LINKS;
    g->nvlink_version = NVLINK_VERSION_4_0;
    for (unsigned int l = 0; l < H100_LINKS; l++) {
        g->links[l].state = NVML_NVLINK_STATE_ACTIVE;
        g->links[l].speed_mbps = H100_LINK_MBPS;
    }
    h100_gpm(&g->gpm);
    g->more.power_instant_mw = g->power_mw;
    g->more.fabric_state = 3; /* NVML_GPU_FABRIC_STATE_COMPLETED: an HGX board's NVSwitch fabric is up */
    g->more.gsp_enabled = 1;
    g->more.gsp_default = 1;

    strcpy(g->name, "NVIDIA H100 80GB HBM3");
    strcpy(g->uuid, k_uuids[i]);
    snprintf(g->serial, sizeof g->serial, "16549220%05u", 100 + i);
    strcpy(g->board_part_number, "692-2G520-0200-000");
    strcpy(g->vbios_version, "96.00.99.00.01");
    strcpy(g->inforom_image_version, "G520.0200.00.05");
    g->crc = vgpu_crc32((const unsigned char *)g + sizeof g->crc, sizeof *g - sizeof g->crc);
}

void vgpu_default_image(struct vgpu_image *image)
{
    memset(image, 0, sizeof *image);
    struct vgpu_header *h = &image->header;
    memcpy(h->magic, VGPU_MAGIC, sizeof h->magic);
    h->layout_version = VGPU_LAYOUT_VERSION;
    h->header_size = sizeof *h;
    h->gpu_size = sizeof(struct vgpu_gpu);
    h->max_gpus = VGPU_MAX_GPUS;
    h->event_capacity = VGPU_EVENT_CAPACITY;
    h->file_size = VGPU_FILE_SIZE;
    h->gpu_count = DEFAULT_GPUS;
    h->hang_max_ms = 10000;
    h->cuda_driver_version = 13000;
    strcpy(h->driver_version, "580.82.07");
    strcpy(h->nvml_version, "13.580.82.07");
    const size_t from = offsetof(struct vgpu_header, event_total);
    h->crc = vgpu_crc32((const unsigned char *)h + from, sizeof *h - from);
    for (unsigned int i = 0; i < DEFAULT_GPUS; i++)
        h100(&image->gpus[i], i);
}
