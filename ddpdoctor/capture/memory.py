"""CUDA memory per device, sampled at each step boundary.

Reads the caching allocator's counters only: unlike ``torch.cuda.mem_get_info`` they never create a CUDA context on
a device the rank has not touched (which would itself cause the cuda:0 bug we look for), and we never reset the peak
counters, so a script that reads ``torch.cuda.max_memory_allocated()`` sees what it would see without ddpdoctor.
"""

from __future__ import annotations

from typing import Any


class DeviceMemory:
    """Per-device memory series for one process."""

    def __init__(self, all_devices: bool = False) -> None:
        self._devices: dict[int, dict[str, Any]] = {}
        self._all_devices = all_devices

    @staticmethod
    def cuda_ready() -> bool:
        try:
            import torch

            return torch.cuda.is_available() and torch.cuda.is_initialized()
        except Exception:
            return False

    def sample(self, step: int) -> None:
        """Record peak (since start) and current allocated/reserved bytes of every device this process touched."""
        if not self.cuda_ready():
            return
        import torch

        for index in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(index)
            peak_reserved = int(stats.get("reserved_bytes.all.peak", 0))
            if peak_reserved == 0 and index not in self._devices and not self._all_devices:
                continue  # a rank's view: only the devices it allocated on
            dev = self._devices.get(index)
            if dev is None:
                props = torch.cuda.get_device_properties(index)
                dev = self._devices[index] = {
                    "device": f"cuda:{index}",
                    "index": index,
                    "name": props.name,
                    "capacity_bytes": int(props.total_memory),
                    "per_step": {
                        "step": [],
                        "peak_allocated_bytes": [],
                        "peak_reserved_bytes": [],
                        "allocated_bytes": [],
                        "reserved_bytes": [],
                    },
                }
            series = dev["per_step"]
            series["step"].append(step)
            series["peak_allocated_bytes"].append(int(stats.get("allocated_bytes.all.peak", 0)))
            series["peak_reserved_bytes"].append(peak_reserved)
            series["allocated_bytes"].append(int(stats.get("allocated_bytes.all.current", 0)))
            series["reserved_bytes"].append(int(stats.get("reserved_bytes.all.current", 0)))

    def to_json(self) -> dict[str, Any]:
        devices = []
        for index in sorted(self._devices):
            dev = dict(self._devices[index])
            series = dev["per_step"]
            dev["peak_allocated_bytes"] = max(series["peak_allocated_bytes"], default=0)
            dev["peak_reserved_bytes"] = max(series["peak_reserved_bytes"], default=0)
            devices.append(dev)
        return {"cuda_available": self.cuda_ready(), "devices": devices}
