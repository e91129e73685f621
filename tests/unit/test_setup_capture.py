"""What the set-up observer (ddpdoctor/capture/setup.py) records about real DataLoaders, in this process.

No torchrun here: the observer's patches are installed around plain DataLoader loops, as `ddpdoctor trace`
installs them around the script.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Subset, TensorDataset

from ddpdoctor.capture.data_digest import digest as _digest
from ddpdoctor.capture.setup import SetupObserver


@pytest.fixture
def observer():
    obs = SetupObserver()
    obs.install()
    try:
        yield obs
    finally:
        obs.uninstall()


def _data(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n) % 3)


def test_a_subset_records_the_length_of_the_dataset_it_shards(observer):
    loader = DataLoader(Subset(_data(10), range(0, 10, 2)), batch_size=2)
    list(loader)
    (epoch,) = observer.to_json()["data_loaders"]
    assert epoch["dataset_len"] == 5 and epoch["root_dataset_len"] == 10
    assert epoch["batches_per_epoch"] == 3 and epoch["batches_yielded"] == 3


def test_a_pass_that_runs_to_its_end_is_marked_exhausted_and_a_broken_one_is_not(observer):
    loader = DataLoader(_data(10), batch_size=4)
    list(loader)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    first, second = observer.to_json()["data_loaders"]
    assert first["exhausted"] and first["batches_yielded"] == 3
    assert not second["exhausted"] and second["batches_yielded"] == 2


def test_labels_digest_follows_the_integer_tensors_only():
    x1, x2 = torch.randn(4, 3), torch.randn(4, 3)  # e.g. two random augmentations of the same samples
    labels = torch.tensor([1, 2, 0, 1])
    assert _digest((x1, labels), integers_only=True) == _digest((x2, labels), integers_only=True)
    assert _digest((x1, labels), integers_only=True) != _digest((x1, labels + 1), integers_only=True)
    assert _digest((x1, labels)) != _digest((x2, labels))
    assert _digest((x1,), integers_only=True) is None  # no integer tensor: nothing to compare


def test_the_same_seed_gives_the_same_index_digest_and_set_epoch_changes_it(observer):
    data = _data(16)
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=2, sampler=sampler)
    list(loader)
    list(loader)  # no set_epoch: the same order
    sampler.set_epoch(1)
    list(loader)
    setup = observer.to_json()
    first, second, third = (e["first_indices_digest"] for e in setup["data_loaders"])
    assert first == second != third
    assert setup["set_epoch_calls"] == [1]
    assert all(e["distributed_sampler"] and e["shuffle"] for e in setup["data_loaders"])


def test_an_iterable_dataset_records_its_first_batch(observer):
    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(5):
                yield torch.tensor([float(i)]), torch.tensor(i)

    list(DataLoader(Stream(), batch_size=2))
    (epoch,) = observer.to_json()["data_loaders"]
    assert epoch["iterable"] and epoch["dataset_len"] is None
    assert epoch["first_batch_digest"] and epoch["first_labels_digest"] and epoch["first_indices_digest"] is None
    assert epoch["exhausted"] and epoch["batches_yielded"] == 3


def test_set_device_calls_are_recorded_without_a_gpu(observer, monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_setDevice", lambda index: None, raising=False)
    torch.cuda.set_device(1)
    assert observer.to_json()["set_device_calls"] == ["1"]


def _rounds(pattern) -> list[int]:
    """Gradient all-reduce rounds per optimizer step the observer counts for a loop over a real module (its
    forwards counted as DDP's are), 2 optimizer steps of ``pattern(forward, model)`` each, the step closed right
    after it (as the optimizer's step hook closes it)."""
    obs = SetupObserver()
    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)

    def forward():
        obs._count_forward(model)
        return model(x).sum()

    for _ in range(2):
        pattern(forward, model)
        obs.on_optimizer_step()
    return obs.sync_rounds


def test_accumulated_rounds_count_and_rounds_whose_gradients_were_cleared_do_not():
    def accumulate(forward, model):  # zero_grad after the step before, 3 micro-batches
        model.zero_grad()
        for _ in range(3):
            forward().backward()

    def accumulate_cleared_first(forward, model):  # zero_grad between the first forward and its backward
        for i in range(3):
            loss = forward()
            if i == 0:
                model.zero_grad()
            loss.backward()

    def sam(forward, model):  # two passes, each cleared between its forward and backward: the first is not summed
        for _ in range(2):
            loss = forward()
            model.zero_grad()
            loss.backward()

    def cleared_before_second(forward, model):  # a second loss after zero_grad (a second, separate update)
        forward().backward()
        model.zero_grad()
        forward().backward()

    def zeroed_in_place(forward, model):  # set_to_none=False: the same tensors, indistinguishable from accumulation
        forward().backward()
        model.zero_grad(set_to_none=False)
        forward().backward()

    assert _rounds(accumulate) == [3, 3]
    assert _rounds(accumulate_cleared_first) == [3, 3]
    assert _rounds(sam) == [1, 1]
    assert _rounds(cleared_before_second) == [1, 1]
    assert _rounds(zeroed_in_place) == [2, 2]


class _Rows(torch.utils.data.Dataset):
    """A dataset holding ``rows`` whose items are (row, local index) or, with ``noise``, (row + noise): a per-rank
    shard when each rank builds it from its own rows, the same data when from the same."""

    def __init__(self, seed: int, noise: str | None = None) -> None:
        self.rows = torch.randn(40, 8, generator=torch.Generator().manual_seed(seed))
        self.noise = noise

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        if self.noise == "torch":  # an augmentation drawing from torch's global generator
            return self.rows[i] + 0.1 * torch.randn(8)
        if self.noise == "unseeded":  # one drawing from a generator no seed reaches
            return self.rows[i] + torch.from_numpy(__import__("numpy").random.default_rng().standard_normal(8))
        return self.rows[i], i


def _content(dataset, global_seed: int, observer) -> dict:
    torch.manual_seed(global_seed)  # each "rank" its own seed: its own order and augmentation
    list(DataLoader(dataset, batch_size=8, shuffle=True))
    return observer.to_json()["data_loaders"][-1]


def test_per_rank_rows_behind_equal_integers_differ_in_their_whole_content(observer):
    """A dataset sharding by rank itself whose items hold a local index: the integers agree across its shards, the
    whole content does not; the same rows read on two ranks agree in both."""
    shard0, shard1, copy = (_content(_Rows(seed), 0, observer) for seed in (100, 101, 100))
    assert shard0["content_digest"] == shard1["content_digest"] == copy["content_digest"] is not None
    assert shard0["content_full_digest"] != shard1["content_full_digest"]
    assert shard0["content_full_digest"] == copy["content_full_digest"] is not None


def test_an_augmentation_reads_alike_at_the_fixed_seeds_and_an_unseeded_one_is_no_evidence(observer):
    a, b = (_content(_Rows(7, noise="torch"), seed, observer) for seed in (0, 1))  # the same rows, per-rank seeds
    assert a["content_digest"] is None and a["content_full_digest"] == b["content_full_digest"] is not None
    other = _content(_Rows(8, noise="torch"), 0, observer)
    assert other["content_full_digest"] != a["content_full_digest"]
    unseeded = _content(_Rows(7, noise="unseeded"), 0, observer)
    assert unseeded["content_full_digest"] is None  # two reads differ: nothing to compare
    # the script's own random stream is left as it was
    torch.manual_seed(3)
    expected = torch.rand(1)
    torch.manual_seed(3)
    _content(_Rows(7, noise="torch"), 3, observer)
    torch.manual_seed(3)
    assert torch.rand(1) == expected


def test_the_passes_whose_batches_feed_optimizer_steps_are_counted(observer):
    """A training loader's batches are followed by optimizer steps (the session calls on_optimizer_step at each);
    a validation loader's, iterated between epochs, by none, however many batches it yields."""
    train, val = DataLoader(_data(8), batch_size=2), DataLoader(_data(40), batch_size=2)
    for _ in range(2):
        for _batch in train:
            observer.on_optimizer_step()
        list(val)
    passes = observer.to_json()["data_loaders"]
    assert [p["steps_fed"] for p in passes] == [4, 0, 4, 0]
    assert [p["batches_yielded"] for p in passes] == [4, 20, 4, 20]
    # gradient accumulation: a step after every other batch still feeds from the training loader
    for i, _batch in enumerate(DataLoader(_data(8), batch_size=2)):
        if i % 2:
            observer.on_optimizer_step()
    assert observer.to_json()["data_loaders"][-1]["steps_fed"] == 2


def test_batchnorm_layers_in_eval_mode_for_training_are_not_counted_as_using_batch_statistics():
    """Frozen BatchNorm (detection and segmentation fine-tuning: the layers put in eval mode after model.train())
    normalises with its running statistics: no synchronising to advise. The layers' modes are read at the DDP
    model's training forwards (here a real module, its forwards counted as DDP's are)."""

    def used(freeze: str | None) -> int | None:
        obs = SetupObserver()
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)
        )
        if freeze == "no running statistics":  # normalises with the batch's statistics even in eval mode
            model[3] = torch.nn.BatchNorm1d(8, track_running_stats=False)
        obs._saw_ddp(model)
        for _ in range(3):
            model.train()
            if freeze is not None:
                for m in model.modules():
                    if isinstance(m, torch.nn.BatchNorm1d):
                        m.eval()
            obs._count_forward(model)
            model(torch.randn(4, 4)).sum().backward()
            obs.on_optimizer_step()
        with torch.no_grad():  # an evaluation forward in train mode changes nothing: only training forwards count
            model.eval()
            obs._count_forward(model)
        (entry,) = obs.to_json()["ddp_models"]
        assert entry["batchnorm_layers"] == 2
        return entry["batchnorm_batch_stats_layers"]

    assert used(None) == 2 and used("eval") == 0 and used("no running statistics") == 1
    from ddpdoctor.metrics.setup import rank_setup_metrics

    capture = {"setup": {"ddp_models": [{"batchnorm_layers": 2, "batchnorm_batch_stats_layers": 0}]}}
    assert rank_setup_metrics(capture)["ddp_batchnorm_layers"] == 0
    capture["setup"]["ddp_models"][0].pop("batchnorm_batch_stats_layers")  # a capture before 2026-12-07
    assert rank_setup_metrics(capture)["ddp_batchnorm_layers"] == 2
