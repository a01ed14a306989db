/* comm/topo: the GPU topology at start, printed like `nvidia-smi topo -m`.
 *
 * NVML (libnvidia-ml.so.1, opened with dlopen so the binary runs where the
 * driver library is missing) gives the PCIe common ancestor of each pair and
 * the NVLink lanes (a lane whose far end is not one of our GPUs goes to an
 * NVSwitch: two GPUs that both reach NVSwitches talk over min(lanes)). CUDA
 * gives P2P access per pair and the device order; sysfs gives each GPU's
 * NUMA node and local CPU list. The NVML declarations below are the few
 * entry points used, as in nvml.h (stable C ABI, versioned names). */
#include <ctype.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/gpu_comm.h"
#include "core/util.h"

#ifdef SD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- formatting (plain C) ---- */

static void link_name(const sd_topo *t, int i, int j, char *s, size_t n)
{
    static const char *names[] = {"X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "?"};
    sd_link l = t->link[i][j];
    if (l == SD_LINK_NVLINK)
        snprintf(s, n, "NV%d", t->nvlinks[i][j]);
    else
        snprintf(s, n, "%s", (unsigned)l <= SD_LINK_UNKNOWN ? names[l] : "?");
}

void sd_topo_format(const sd_topo *t, char *buf, size_t len)
{
    size_t off = 0;
    if (len)
        buf[0] = 0;
    sd_bufappend(buf, len, &off, "%-8s", "");
    for (int j = 0; j < t->n; j++)
        sd_bufappend(buf, len, &off, "GPU%-5d", j);
    sd_bufappend(buf, len, &off, "%-16s%s\n", "CPU Affinity", "NUMA Affinity");
    for (int i = 0; i < t->n; i++) {
        sd_bufappend(buf, len, &off, "GPU%-5d", i);
        for (int j = 0; j < t->n; j++) {
            char s[16];
            link_name(t, i, j, s, sizeof s);
            sd_bufappend(buf, len, &off, "%-8s", s);
        }
        char numa[16];
        if (t->numa[i] >= 0)
            snprintf(numa, sizeof numa, "%d", t->numa[i]);
        else
            snprintf(numa, sizeof numa, "N/A");
        sd_bufappend(buf, len, &off, "%-16s%s\n", t->cpus[i][0] ? t->cpus[i] : "N/A", numa);
    }
    sd_bufappend(buf, len, &off, "\n%-8s", "P2P");
    for (int j = 0; j < t->n; j++)
        sd_bufappend(buf, len, &off, "GPU%-5d", j);
    sd_bufappend(buf, len, &off, "\n");
    for (int i = 0; i < t->n; i++) {
        sd_bufappend(buf, len, &off, "GPU%-5d", i);
        for (int j = 0; j < t->n; j++)
            sd_bufappend(buf, len, &off, "%-8s",
                i == j ? "X" : t->p2p[i][j] > 0 ? "OK" : t->p2p[i][j] == 0 ? "NS" : "?");
        sd_bufappend(buf, len, &off, "\n");
    }
    sd_bufappend(buf, len, &off,
        "\nLegend: X = self, NV# = # NVLinks, PIX = one PCIe switch, PXB = several PCIe "
        "switches, PHB = a PCIe host bridge, NODE = host bridges in one NUMA node, SYS = across "
        "NUMA nodes; P2P: OK = direct access, NS = not supported\n");
}

/* ---- probing ---- */

typedef struct nvml_pci {
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} nvml_pci; /* nvmlPciInfo_t (v3) */

typedef void *nvml_dev;
typedef struct nvml {
    void *lib;
    int (*init)(void);
    int (*shutdown)(void);
    const char *(*error_string)(int);
    int (*count)(unsigned *);
    int (*handle)(unsigned, nvml_dev *);
    int (*name)(nvml_dev, char *, unsigned);
    int (*pci)(nvml_dev, nvml_pci *);
    int (*ancestor)(nvml_dev, nvml_dev, int *);
    int (*nvlink_state)(nvml_dev, unsigned, int *);
    int (*nvlink_remote)(nvml_dev, unsigned, nvml_pci *);
} nvml;

#define NVML_MAX_LINKS 18 /* NVML_NVLINK_MAX_LINKS */

static int nvml_open(nvml *v, sd_err *err)
{
    memset(v, 0, sizeof *v);
    v->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!v->lib)
        return sd_err_set(err, SD_ENOTSUP,
                          "topology: libnvidia-ml.so.1 cannot be opened (no NVIDIA driver here)");
    struct {
        void **fn;
        const char *sym;
    } want[] = {
        {(void **)&v->init, "nvmlInit_v2"},
        {(void **)&v->shutdown, "nvmlShutdown"},
        {(void **)&v->error_string, "nvmlErrorString"},
        {(void **)&v->count, "nvmlDeviceGetCount_v2"},
        {(void **)&v->handle, "nvmlDeviceGetHandleByIndex_v2"},
        {(void **)&v->name, "nvmlDeviceGetName"},
        {(void **)&v->pci, "nvmlDeviceGetPciInfo_v3"},
        {(void **)&v->ancestor, "nvmlDeviceGetTopologyCommonAncestor"},
        {(void **)&v->nvlink_state, "nvmlDeviceGetNvLinkState"},
        {(void **)&v->nvlink_remote, "nvmlDeviceGetNvLinkRemotePciInfo_v2"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(want); i++) {
        *want[i].fn = dlsym(v->lib, want[i].sym);
        if (!*want[i].fn) {
            dlclose(v->lib);
            v->lib = NULL;
            return sd_err_set(err, SD_ENOTSUP, "topology: libnvidia-ml.so.1 lacks %s (driver too old)",
                              want[i].sym);
        }
    }
    int r = v->init();
    if (r) {
        sd_err_set(err, SD_EDEVICE, "topology: nvmlInit failed: %s", v->error_string(r));
        dlclose(v->lib);
        v->lib = NULL;
        return SD_EDEVICE;
    }
    return 0;
}

static void nvml_close(nvml *v)
{
    if (v->lib) {
        v->shutdown();
        dlclose(v->lib);
    }
}

#ifdef SD_HAVE_CUDA
/* "00000000:18:00.0" or "0000:18:00.0" -> domain, bus, device. */
static int parse_bdf(const char *s, unsigned *dom, unsigned *bus, unsigned *dev)
{
    unsigned fn;
    return sscanf(s, "%x:%x:%x.%x", dom, bus, dev, &fn) == 4 ? 0 : -1;
}
#endif

static void sysfs_info(sd_topo *t, int i)
{
    char path[256], line[128];
    t->numa[i] = -1;
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", t->bus_id[i]);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(line, sizeof line, f))
            t->numa[i] = atoi(line);
        fclose(f);
    }
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpulist", t->bus_id[i]);
    f = fopen(path, "r");
    if (f) {
        if (fgets(t->cpus[i], sizeof t->cpus[i], f)) {
            size_t l = strlen(t->cpus[i]);
            while (l && isspace((unsigned char)t->cpus[i][l - 1]))
                t->cpus[i][--l] = 0;
        }
        fclose(f);
    }
}

static sd_link level_link(int level)
{
    /* nvmlGpuTopologyLevel_t */
    switch (level) {
    case 0: return SD_LINK_PIX;  /* INTERNAL: one board */
    case 10: return SD_LINK_PIX; /* SINGLE */
    case 20: return SD_LINK_PXB; /* MULTIPLE */
    case 30: return SD_LINK_PHB; /* HOSTBRIDGE */
    case 40: return SD_LINK_NODE;
    case 50: return SD_LINK_SYS;
    default: return SD_LINK_UNKNOWN;
    }
}

int sd_topo_probe(sd_topo *t, sd_err *err)
{
    memset(t, 0, sizeof *t);
    nvml v;
    int rc = nvml_open(&v, err);
    if (rc)
        return rc;
    unsigned count = 0;
    int r = v.count(&count);
    if (r || count == 0) {
        nvml_close(&v);
        return sd_err_set(err, SD_EDEVICE, "topology: NVML sees no GPU (%s)",
                          r ? v.error_string(r) : "count 0");
    }
    int n = (int)SD_MIN(count, (unsigned)SD_GPU_MAX_RANKS);
    nvml_dev dev[SD_GPU_MAX_RANKS];
    nvml_pci pci[SD_GPU_MAX_RANKS];
    /* device order: CUDA's, matched by PCI address; NVML's without CUDA */
    unsigned cdom[SD_GPU_MAX_RANKS], cbus[SD_GPU_MAX_RANKS], cdev[SD_GPU_MAX_RANKS];
    int n_cuda = 0;
#ifdef SD_HAVE_CUDA
    if (cudaGetDeviceCount(&n_cuda) != cudaSuccess)
        n_cuda = 0;
    n_cuda = SD_MIN(n_cuda, SD_GPU_MAX_RANKS);
    for (int i = 0; i < n_cuda; i++) {
        char b[32];
        if (cudaDeviceGetPCIBusId(b, sizeof b, i) != cudaSuccess ||
            parse_bdf(b, &cdom[i], &cbus[i], &cdev[i]))
            n_cuda = 0;
    }
    cudaGetLastError();
#endif
    nvml_dev all[SD_GPU_MAX_RANKS];
    nvml_pci allp[SD_GPU_MAX_RANKS];
    for (int k = 0; k < n; k++)
        if ((r = v.handle((unsigned)k, &all[k])) || (r = v.pci(all[k], &allp[k]))) {
            nvml_close(&v);
            return sd_err_set(err, SD_EDEVICE, "topology: NVML device %d: %s", k,
                              v.error_string(r));
        }
    if (n_cuda > 0) {
        n = n_cuda;
        for (int i = 0; i < n; i++) {
            int found = -1;
            for (int k = 0; k < (int)SD_MIN(count, (unsigned)SD_GPU_MAX_RANKS) && found < 0; k++)
                if (allp[k].domain == cdom[i] && allp[k].bus == cbus[i] && allp[k].device == cdev[i])
                    found = k;
            if (found < 0) {
                nvml_close(&v);
                return sd_err_set(err, SD_EDEVICE,
                                  "topology: CUDA device %d (%04x:%02x:%02x.0) is not among NVML's",
                                  i, cdom[i], cbus[i], cdev[i]);
            }
            dev[i] = all[found];
            pci[i] = allp[found];
        }
    } else {
        memcpy(dev, all, sizeof dev);
        memcpy(pci, allp, sizeof pci);
    }
    t->n = n;
    int sw[SD_GPU_MAX_RANKS] = {0};
    for (int i = 0; i < n; i++) {
        if (v.name(dev[i], t->name[i], sizeof t->name[i]))
            snprintf(t->name[i], sizeof t->name[i], "GPU %d", i);
        snprintf(t->bus_id[i], sizeof t->bus_id[i], "%04x:%02x:%02x.0", pci[i].domain & 0xffff,
                 pci[i].bus, pci[i].device);
        sysfs_info(t, i);
        for (unsigned l = 0; l < NVML_MAX_LINKS; l++) {
            int active = 0;
            nvml_pci rp;
            if (v.nvlink_state(dev[i], l, &active) || !active)
                continue;
            if (v.nvlink_remote(dev[i], l, &rp)) { /* an active lane to no PCI device: a switch */
                sw[i]++;
                continue;
            }
            int peer = -1;
            for (int j = 0; j < n; j++)
                if (j != i && rp.domain == pci[j].domain && rp.bus == pci[j].bus &&
                    rp.device == pci[j].device)
                    peer = j;
            if (peer >= 0)
                t->nvlinks[i][peer]++;
            else
                sw[i]++;
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            t->p2p[i][j] = i == j ? 1 : -1;
            if (i == j) {
                t->link[i][j] = SD_LINK_SELF;
                continue;
            }
            t->nvlinks[i][j] += SD_MIN(sw[i], sw[j]);
            if (t->nvlinks[i][j] > 0) {
                t->link[i][j] = SD_LINK_NVLINK;
                continue;
            }
            int level = -1;
            t->link[i][j] = v.ancestor(dev[i], dev[j], &level) ? SD_LINK_UNKNOWN : level_link(level);
        }
#ifdef SD_HAVE_CUDA
    if (n_cuda > 0)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                int ok = 0;
                if (i != j && cudaDeviceCanAccessPeer(&ok, i, j) == cudaSuccess)
                    t->p2p[i][j] = ok;
            }
    cudaGetLastError();
#endif
    nvml_close(&v);
    return 0;
}
