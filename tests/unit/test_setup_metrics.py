"""Set-up metrics (ddpdoctor/metrics/setup.py) from capture files.

Recorded inputs: tests/fixtures/setup_captures.json holds what `ddpdoctor trace` observed in real 2-rank gloo
runs of samples/ddp_train.py and the samples/mistake_*.py (regenerate with
tests/fixtures/make_setup_captures.py). Hand-made inputs, for what these CPU runs cannot show (CUDA devices,
iterable datasets, ...), are built by the `capture()` / `epoch()` helpers below and say which case they stand
for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.metrics.setup import (
    SETUP_RANK_METRICS,
    compute_device,
    rank_setup_metrics,
    setup_metrics,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "setup_captures.json"
RECORDED = json.loads(FIXTURE.read_text())


def recorded(name: str) -> tuple[dict[int, dict], dict]:
    return setup_metrics({int(rank): cap for rank, cap in RECORDED[name].items()})


def column(ranks: dict[int, dict], name: str) -> list:
    return [ranks[r][name] for r in sorted(ranks)]


# --------------------------------------------------------------------------------------------- recorded runs
def test_healthy_ddp_train_is_sharded_with_a_new_order_every_epoch():
    ranks, run = recorded("ddp_train")
    assert run["data_duplication_factor"] == 1.0
    assert column(ranks, "distributed_sampler") == [True, True]
    assert column(ranks, "sampler_shuffle") == [True, True]
    assert column(ranks, "dataloader_epochs") == [2, 2]
    assert column(ranks, "epochs_repeating_order") == [0, 0]
    assert column(ranks, "set_epoch_calls") == [2, 2]
    assert column(ranks, "batches_per_epoch") == [6, 6]
    assert column(ranks, "epoch_dataset_share") == [0.5, 0.5]
    assert column(ranks, "ddp_sync_rounds_per_step") == [1.0, 1.0]
    # a CPU run: no CUDA device, so the GPU checks have nothing to say
    assert column(ranks, "set_device_calls") == [None, None]
    assert column(ranks, "gpu_shared_ranks") == [None, None]
    assert column(ranks, "dp_gathered_bytes") == [None, None]


def test_no_distributed_sampler_with_one_seed_means_every_rank_reads_the_same_samples():
    ranks, run = recorded("no_distributed_sampler")
    assert run["data_duplication_factor"] == 2.0
    assert column(ranks, "distributed_sampler") == [False, False]
    assert column(ranks, "epoch_dataset_share") == [1.0, 1.0]
    first = [cap["setup"]["data_loaders"][0] for cap in RECORDED["no_distributed_sampler"].values()]
    assert first[0]["first_indices_digest"] == first[1]["first_indices_digest"]


def test_set_epoch_missing_repeats_the_order_of_every_epoch():
    ranks, run = recorded("set_epoch_missing")
    assert column(ranks, "dataloader_epochs") == [3, 3]
    assert column(ranks, "epochs_repeating_order") == [2, 2]
    assert column(ranks, "set_epoch_calls") == [0, 0]
    assert run["data_duplication_factor"] == 1.0  # sharded all the same


def test_uneven_hand_made_shards_differ_by_a_batch_and_are_not_duplicates():
    ranks, run = recorded("uneven_batches")
    assert column(ranks, "batches_per_epoch") == [7, 6]
    # Subset shards: the first index batches are the same local positions, but the labels behind them differ
    first = [cap["setup"]["data_loaders"][0] for cap in RECORDED["uneven_batches"].values()]
    assert first[0]["first_indices_digest"] == first[1]["first_indices_digest"]
    assert first[0]["first_labels_digest"] != first[1]["first_labels_digest"]
    assert run["data_duplication_factor"] == 1.0
    assert sum(column(ranks, "epoch_dataset_share")) == pytest.approx(1.0)  # shares of the dataset below the Subset


def test_gradient_accumulation_without_no_sync_syncs_every_micro_batch():
    ranks, _ = recorded("grad_accum_no_sync")
    assert column(ranks, "ddp_sync_rounds_per_step") == [4.0, 4.0]
    assert column(ranks, "ddp_forwards_per_step") == [4.0, 4.0]


def test_batchnorm_layers_and_the_per_rank_batch_are_read():
    ranks, _ = recorded("batchnorm_small_batch")
    assert column(ranks, "ddp_batchnorm_layers") == [1, 1]
    assert column(ranks, "ddp_sync_batchnorm_layers") == [0, 0]
    assert column(ranks, "batch_size") == [8, 8]


def test_dataparallel_gathered_bytes_per_step():
    ranks, run = recorded("dp_gather_outputs")
    assert ranks[0]["dp_gathered_bytes"] == 8 * 128 * 8192 * 4  # float32 logits [batch, seq, vocab]
    assert ranks[0]["ddp_sync_rounds_per_step"] is None  # no DDP model
    assert run["data_duplication_factor"] is None  # no DataLoader


# ------------------------------------------------------------------------------------- hand-made edge cases
def epoch(loader: int = 1, **overrides) -> dict:
    """One DataLoader pass as the capture records it (hand-made)."""
    entry = {
        "loader": loader,
        "dataset_len": 100,
        "root_dataset_len": 100,
        "iterable": False,
        "distributed_sampler": False,
        "shuffle": None,
        "batch_size": 10,
        "batches_per_epoch": 10,
        "batches_yielded": 10,
        "exhausted": True,
        "first_indices_digest": "idx",
        "first_batch_digest": None,
        "first_labels_digest": "labels",
    }
    entry.update(overrides)
    return entry


def capture(loaders=(), *, device: str = "cpu", ddp_device: str | None = "cpu", hostname="host0", **setup) -> dict:
    """A rank's capture file (hand-made): its data-loader passes, DDP model and devices."""
    return {
        "hostname": hostname,
        "device": device,
        "setup": {
            "data_loaders": list(loaders),
            "set_epoch_calls": [],
            "set_device_calls": [],
            "ddp_models": [] if ddp_device is None else [{"batchnorm_layers": 0, "device": ddp_device}],
            "ddp_sync_rounds_per_step": {"1": 10},
            "ddp_forwards_per_step": {"1": 10},
            **setup,
        },
    }


def test_the_training_loader_is_the_one_that_yielded_most_batches():
    # a peek (`next(iter(train))`), then 2 epochs of training, each followed by a 3-batch validation pass
    loaders = [
        epoch(loader=1, batches_yielded=1, exhausted=False, first_indices_digest="a"),
        epoch(loader=1, first_indices_digest="b"),
        epoch(loader=2, batches_per_epoch=3, batches_yielded=3, batch_size=50),
        epoch(loader=1, first_indices_digest="c"),
        epoch(loader=2, batches_per_epoch=3, batches_yielded=3, batch_size=50),
    ]
    metrics = rank_setup_metrics(capture(loaders))
    assert metrics["dataloader_epochs"] == 3 and metrics["batch_size"] == 10
    assert metrics["epochs_repeating_order"] == 0


def test_a_finished_pass_counts_its_batches_over_len_loader():
    # an iterable dataset whose __len__ is wrong: what the pass yielded is the epoch's length
    metrics = rank_setup_metrics(capture([epoch(batches_per_epoch=10, batches_yielded=8, exhausted=True)]))
    assert metrics["batches_per_epoch"] == 8
    # a loop that breaks early: len(loader)
    metrics = rank_setup_metrics(capture([epoch(batches_per_epoch=10, batches_yielded=4, exhausted=False)]))
    assert metrics["batches_per_epoch"] == 10


def test_identical_first_batches_of_an_iterable_dataset_are_duplicates():
    same = epoch(
        iterable=True,
        dataset_len=None,
        root_dataset_len=None,
        first_indices_digest=None,
        first_batch_digest="stream-start",
    )
    ranks, run = setup_metrics(
        {0: capture([same]), 1: capture([same]), 2: capture([dict(same, first_batch_digest="x")])}
    )
    assert run["data_duplication_factor"] == 2.0
    assert ranks[0]["epoch_dataset_share"] is None


def test_unseeded_random_samplers_read_the_whole_dataset_on_every_rank():
    # no DistributedSampler, different orders on each rank, each rank iterates all 100 samples of the same data
    # (equal content at fixed indices)
    ranks, run = setup_metrics(
        {
            r: capture([epoch(first_indices_digest=f"order{r}", first_labels_digest=f"l{r}", content_digest="same")])
            for r in range(4)
        }
    )
    assert run["data_duplication_factor"] == 4.0


def test_hand_sharded_data_of_equal_length_in_different_orders_is_not_a_duplicate():
    # each rank loads its own shard file of 100 samples: different content at the same fixed indices
    ranks, run = setup_metrics(
        {
            r: capture([epoch(first_indices_digest=f"order{r}", first_labels_digest=f"l{r}", content_digest=f"c{r}")])
            for r in range(4)
        }
    )
    assert run["data_duplication_factor"] == 1.0


def test_equal_length_and_different_orders_without_content_is_undecided():
    # no integers to compare (e.g. float-only data): same data or own shards cannot be told apart
    ranks, run = setup_metrics(
        {r: capture([epoch(first_indices_digest=f"order{r}", first_labels_digest=None)]) for r in range(2)}
    )
    assert run["data_duplication_factor"] is None
    assert "cannot be told from per-rank shards" in run["not_measured"]["data_duplication_factor"]


def test_identical_indices_without_content_are_undecided_not_duplicates():
    # the same seed gives the same permutation on every rank, over per-rank datasets of the same length
    ranks, run = setup_metrics(
        {r: capture([epoch(distributed_sampler=True, first_labels_digest=None)]) for r in range(2)}
    )
    assert run["data_duplication_factor"] is None
    assert "same indices" in run["not_measured"]["data_duplication_factor"]


def test_a_dataset_that_shards_by_rank_itself_is_not_called_a_duplicate():
    # same indices, different labels behind them: each rank has its own data (e.g. a per-rank file)
    ranks, run = setup_metrics({r: capture([epoch(first_labels_digest=f"labels{r}")]) for r in range(2)})
    assert run["data_duplication_factor"] == 1.0


def test_equal_integers_over_different_data_are_not_duplicates():
    """A dataset that shards by rank itself, each item (x, y, its local index) or with a mask of ones: the same
    indices and the same integers on every rank, over different rows (a traced 2-rank job, 2026-12-07, was told it
    lacked a DistributedSampler). The datasets' whole content at fixed indices tells them apart."""
    ranks, run = setup_metrics(
        {r: capture([epoch(first_labels_digest="local-index", content_full_digest=f"rows{r}")]) for r in range(2)}
    )
    assert run["data_duplication_factor"] == 1.0
    # every rank iterating its own whole shard in its own order: no dataset pass is another rank's
    ranks, run = setup_metrics(
        {
            r: capture(
                [epoch(first_indices_digest=f"o{r}", content_digest="local-index", content_full_digest=f"rows{r}")]
            )
            for r in range(2)
        }
    )
    assert run["data_duplication_factor"] == 1.0
    # the same rows on every rank are still duplicates
    _, run = setup_metrics(
        {r: capture([epoch(first_labels_digest="local-index", content_full_digest="rows")]) for r in range(2)}
    )
    assert run["data_duplication_factor"] == 2.0


def test_float_only_data_the_whole_content_decides():
    """No integers anywhere: where the datasets read alike at fixed seeds (content_full_digest) the ranks' passes
    over them can be compared; where the reads differed (None: randomness the seeds do not reach) it stays
    undecided."""
    same = {r: capture([epoch(first_indices_digest=f"o{r}", first_labels_digest=None, content_full_digest="x")])
            for r in range(2)}  # fmt: skip
    assert setup_metrics(same)[1]["data_duplication_factor"] == 2.0
    own = {r: capture([epoch(first_indices_digest=f"o{r}", first_labels_digest=None, content_full_digest=f"x{r}")])
           for r in range(2)}  # fmt: skip
    assert setup_metrics(own)[1]["data_duplication_factor"] == 1.0
    same_order = {r: capture([epoch(first_labels_digest=None, content_full_digest="x")]) for r in range(2)}
    assert setup_metrics(same_order)[1]["data_duplication_factor"] == 2.0
    unread = {r: capture([epoch(first_indices_digest=f"o{r}", first_labels_digest=None)]) for r in range(2)}
    _, run = setup_metrics(unread)
    assert (
        run["data_duplication_factor"] is None
        and "read differently twice" in run["not_measured"]["data_duplication_factor"]
    )


def test_the_training_loader_is_the_one_that_feeds_the_steps_not_the_longest():
    """Rank 0 alone evaluates on a validation set of 40 batches after each 8-batch training epoch (a traced 2-rank
    job, 2026-12-07, was told its ranks had uneven batches and that its sampler repeated its order): the loader
    whose batches fed the optimizer steps is the training loader."""
    train = {"distributed_sampler": True, "shuffle": True, "batches_per_epoch": 8, "batches_yielded": 8}
    val = {"loader": 2, "batches_per_epoch": 40, "batches_yielded": 40, "steps_fed": 0, "first_indices_digest": "v"}
    rank0 = capture([epoch(**train, steps_fed=8, first_indices_digest="a"), epoch(**val),
                     epoch(**train, steps_fed=8, first_indices_digest="b"), epoch(**val)])  # fmt: skip
    rank1 = capture([epoch(**train, steps_fed=8, first_indices_digest="c"),
                     epoch(**train, steps_fed=8, first_indices_digest="d")])  # fmt: skip
    ranks, _ = setup_metrics({0: rank0, 1: rank1})
    assert column(ranks, "batches_per_epoch") == [8, 8]
    assert column(ranks, "epochs_repeating_order") == [0, 0] and column(ranks, "distributed_sampler") == [True, True]
    # a capture without steps_fed (before 2026-12-07): the loader that yielded the most, as before
    old = capture([{k: v for k, v in e.items() if k != "steps_fed"} for e in rank0["setup"]["data_loaders"]])
    assert rank_setup_metrics(old)["batches_per_epoch"] == 40


def test_single_rank_is_not_duplicated():
    _, run = setup_metrics({0: capture([epoch()])})
    assert run["data_duplication_factor"] == 1.0


def test_sync_rounds_are_the_median_step_not_start_up():
    metrics = rank_setup_metrics(capture([], ddp_sync_rounds_per_step={"0": 1, "1": 2, "4": 30}))
    assert metrics["ddp_sync_rounds_per_step"] == 4.0


def test_no_capture_gives_none_for_every_metric():
    assert rank_setup_metrics(None) == dict.fromkeys(SETUP_RANK_METRICS)
    assert setup_metrics({}) == (
        {},
        {"data_duplication_factor": None, "steps_detected": None, "uneven_idle_summary": None},
    )


# ------------------------------------------------------------------- CUDA (hand-made: no GPU in these runs)
def test_ranks_without_set_device_on_one_gpu_share_it():
    # `model.cuda()` in every rank, no set_device: every rank computes on cuda:0
    caps = {r: capture(device="cuda:0", ddp_device="cuda:0") for r in range(2)}
    ranks, _ = setup_metrics(caps)
    assert column(ranks, "set_device_calls") == [0, 0]
    assert column(ranks, "gpu_shared_ranks") == [2, 2]
    assert column(ranks, "current_device_mismatch") == [False, False]


def test_a_rank_on_its_own_gpu_whose_current_device_stayed_cuda0_is_a_mismatch():
    # `model.to(f"cuda:{local_rank}")` without set_device: current device cuda:0, model on cuda:1
    caps = {
        0: capture(device="cuda:0", ddp_device="cuda:0"),
        1: capture(device="cuda:0", ddp_device="cuda:1"),
    }
    ranks, _ = setup_metrics(caps)
    assert column(ranks, "gpu_shared_ranks") == [1, 1]
    assert column(ranks, "current_device_mismatch") == [False, True]
    assert compute_device(caps[1]) == "cuda:1"


def test_ranks_isolated_by_cuda_visible_devices_do_not_share():
    # each rank launched with its own CUDA_VISIBLE_DEVICES: both see their GPU as cuda:0
    caps = {r: capture(device="cuda:0", ddp_device="cuda:0", cuda_visible_devices=str(r)) for r in range(2)}
    ranks, _ = setup_metrics(caps)
    assert column(ranks, "gpu_shared_ranks") == [1, 1]
    assert column(ranks, "current_device_mismatch") == [False, False]


def test_ranks_on_different_hosts_do_not_share_a_gpu():
    caps = {r: capture(device="cuda:0", ddp_device="cuda:0", hostname=f"node{r}") for r in range(2)}
    ranks, _ = setup_metrics(caps)
    assert column(ranks, "gpu_shared_ranks") == [1, 1]


def test_set_device_calls_are_counted_on_cuda_ranks():
    caps = {r: capture(device=f"cuda:{r}", ddp_device=f"cuda:{r}", set_device_calls=[str(r)]) for r in range(2)}
    ranks, _ = setup_metrics(caps)
    assert column(ranks, "set_device_calls") == [1, 1]
    assert column(ranks, "gpu_shared_ranks") == [1, 1]
    assert column(ranks, "current_device_mismatch") == [False, False]
