/* This machine as hwloc sees it: cores, NUMA nodes, GPUs and whether NVLink
 * joins them; and this rank's report of it for the topology's gather. */
#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "rmoe_system.h"

int rmoe_local_hw_probe(struct rmoe_local_hw *hw)
{
	memset(hw, 0, sizeof(*hw));
	hw->nvlink = -1;
	hwloc_topology_t topo;
	if (hwloc_topology_init(&topo) != 0)
		return rmoe_error(RMOE_ENOTSUP, "hwloc_topology_init failed");
	/* GPUs are I/O objects: hwloc drops them unless asked to keep them. */
	hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
	if (hwloc_topology_load(topo) != 0) {
		hwloc_topology_destroy(topo);
		return rmoe_error(RMOE_ENOTSUP, "hwloc_topology_load failed");
	}
	int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
	int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
	hw->cores = cores > 0 ? cores : 0;
	hw->numa_nodes = numa > 0 ? numa : 0;

	/* A GPU may appear as a CUDA co-processor, an NVML device and a PCI
	 * function at once: count one kind, the most specific present. */
	int cuda = 0, nvml = 0, pci = 0;
	for (hwloc_obj_t o = hwloc_get_next_osdev(topo, NULL); o; o = hwloc_get_next_osdev(topo, o)) {
		if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_COPROC && o->subtype && strcmp(o->subtype, "CUDA") == 0)
			cuda++;
		else if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_GPU && o->name && strncmp(o->name, "nvml", 4) == 0)
			nvml++;
	}
	for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, NULL); o; o = hwloc_get_next_pcidev(topo, o)) {
		unsigned cls = o->attr->pcidev.class_id;
		if (o->attr->pcidev.vendor_id == 0x10de && (cls == 0x0300 || cls == 0x0302))
			pci++;
	}
	hw->gpus = cuda ? cuda : nvml ? nvml : pci;

	if (hw->gpus == 0) {
		hw->nvlink = 0;
	} else {
		/* hwloc's NVML backend publishes NVLink bandwidths between GPUs as
		 * the "NVLinkBandwidth" distances; without them NVLink is unknown. */
		unsigned nr = 1;
		struct hwloc_distances_s *d = NULL;
		if (hwloc_distances_get_by_name(topo, "NVLinkBandwidth", &nr, &d, 0) == 0 && nr > 0 && d) {
			hw->nvlink = 0;
			for (unsigned i = 0; i < d->nbobjs; i++)
				for (unsigned j = 0; j < d->nbobjs; j++)
					if (i != j && d->values[i * d->nbobjs + j] > 0)
						hw->nvlink = 1;
			hwloc_distances_release(topo, d);
		}
	}
	hwloc_topology_destroy(topo);
	return 0;
}

void rmoe_rank_info_local(const char *host, struct rmoe_rank_info *me, struct rmoe_local_hw *hw)
{
	if (rmoe_local_hw_probe(hw) != 0) {
		memset(hw, 0, sizeof(*hw));
		hw->nvlink = -1;
	}
	memset(me, 0, sizeof(*me));
	snprintf(me->host, sizeof(me->host), "%s", host);
	me->gpus = hw->gpus;
	me->nvlink = hw->nvlink;
}
