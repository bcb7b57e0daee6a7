"""engine/transfer_stats.py: the one record of a weight transfer (reshard, checkpoint engine, delta tracker) and the
metric names the trainer has always logged from it."""

from __future__ import annotations

from hybridflow.engine.transfer_stats import TransferStats


def _delta_sync() -> TransferStats:
    stats = TransferStats()
    stats.count(3, 300)  # changed: sent
    stats.count(2, 1000, moved=False)  # unchanged since the last verified sync: skipped
    stats.buckets, stats.max_bucket_bytes, stats.seconds = 2, 200, 0.5
    return stats


def test_what_a_delta_left_out_is_the_total_minus_what_moved():
    stats = _delta_sync()
    assert (stats.tensors, stats.bytes, stats.tensors_total, stats.bytes_total) == (3, 300, 5, 1300)
    assert (stats.skipped, stats.skipped_bytes) == (2, 1000)


def test_weight_sync_metrics_keep_their_names():
    assert _delta_sync().weight_sync_metrics() == {
        "weight_sync/bytes_sent": 300.0, "weight_sync/bytes_total": 1300.0, "weight_sync/tensors_sent": 3.0,
        "weight_sync/skipped": 2.0, "weight_sync/skipped_bytes": 1000.0}


def test_update_weights_metrics_keep_their_names_and_leave_out_what_was_not_measured():
    stats = _delta_sync()
    assert stats.update_weights_metrics() == {"update_weights/tensors": 3.0, "update_weights/bytes": 300.0,
                                              "update_weights/buckets": 2.0, "update_weights/max_bucket_bytes": 200.0}
    stats.peak_rss_rise_bytes = 4096
    assert stats.update_weights_metrics()["update_weights/peak_rss_rise_bytes"] == 4096.0
    assert "update_weights/seconds" not in stats.update_weights_metrics()  # timing_s/update_weights has them


def test_the_record_travels_as_floats_and_back():
    stats = _delta_sync()
    floats = stats.as_floats()
    assert all(isinstance(v, float) for v in floats.values()) and "peak_rss_rise_bytes" not in floats
    back = TransferStats.from_floats({**floats, "not_a_field": 1.0})
    assert back == stats and isinstance(back.bytes, int)
