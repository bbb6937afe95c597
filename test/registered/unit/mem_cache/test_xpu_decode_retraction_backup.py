"""An unset decode retraction backup degrades to cpu_tensor on a resolved XPU."""

import unittest
from types import SimpleNamespace
from unittest import mock

from sglang.srt.mem_cache import kv_cache_builder
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.runtime_context import get_context, get_disagg, get_memory
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=12, suite="base-a-test-cpu")


def _tp_worker() -> SimpleNamespace:
    """A decode worker whose KV pool is a plain MHA pool (host-pool capable)."""
    pool = MHATokenToKVPool.__new__(MHATokenToKVPool)
    return SimpleNamespace(
        get_memory_pool=lambda: (None, SimpleNamespace(get_kvcache=lambda: pool)),
        is_hybrid_swa=False,
        model_runner=SimpleNamespace(model_config=SimpleNamespace()),
    )


class TestDecodeRetractionBackupOnXpu(CustomTestCase):
    def _resolve(self, device: str) -> tuple[str, str, float]:
        with (
            get_context().override_server_args(
                device=device, disaggregation_mode="decode"
            ),
            # Pin the hardware probe (a ROCm runner would say True) and the model
            # fact the fake config cannot answer.
            mock.patch.object(kv_cache_builder, "is_hip", return_value=False),
            mock.patch.object(kv_cache_builder, "uses_ssm_state", return_value=False),
        ):
            returned = kv_cache_builder.resolve_decode_retraction_backup(
                tp_worker=_tp_worker()
            )
            published = get_disagg().disaggregation_decode_retraction_backup
            return returned, published, get_memory().hicache_ratio

    def test_xpu_degrades_to_cpu_tensor(self):
        returned, published, ratio = self._resolve("xpu")
        self.assertEqual(returned, "cpu_tensor")
        self.assertEqual(published, "cpu_tensor")
        self.assertEqual(ratio, 2.0)

    def test_cuda_keeps_host_pool(self):
        returned, published, _ratio = self._resolve("cuda")
        self.assertEqual((returned, published), ("host_pool", "host_pool"))

    def test_cpu_device_keeps_todays_choice(self):
        # Keyed on the resolved device: only "xpu" changes.
        returned, _published, _ratio = self._resolve("cpu")
        self.assertEqual(returned, "host_pool")


if __name__ == "__main__":
    unittest.main()
