"""This floor's configuration rule, run by the launch's check pipeline (run stage): the data files exist and hold at
least one step's prompts."""

from __future__ import annotations

from hybridflow.data.io import DataFileError, as_file_list, count_rows

__all__ = ["check_data_files"]


def check_data_files(cfg, errors: list[str]) -> None:
    """Every data file exists, and the training set holds at least one step's prompts (``drop_last``: a smaller
    set gives no batch at all). Counts rows (a parquet file's metadata; json is read) -- prompts filtered for length
    later (``data.filter_overlong_prompts``) are checked when the dataset is built."""
    data = cfg.data
    for key, files, limit, need in (("data.train_files", data.train_files, data.train_max_samples,
                                     data.gen_batch_size or data.train_batch_size),
                                    ("data.val_files", data.val_files, data.val_max_samples, 1)):
        if files is None and key == "data.val_files":
            continue
        try:
            paths = as_file_list(files, key)
            counts = [count_rows(p) for p in paths]
        except DataFileError as e:
            errors.append(f"{key}: {e}")
            continue
        empty = [p for p, c in zip(paths, counts) if c == 0]
        if empty:
            errors.append(f"{key}: data file '{empty[0]}' contains no rows; check the preprocessing output")
            continue
        if any(c is None for c in counts):  # a hub dataset: its size is known once it downloads
            continue
        rows = sum(counts)
        usable = min(rows, limit) if limit is not None and limit > 0 else rows
        if usable < need:
            which = "data.gen_batch_size" if data.gen_batch_size and data.gen_batch_size != data.train_batch_size \
                else "data.train_batch_size"
            capped = f" (data.train_max_samples={limit})" if usable < rows else ""
            errors.append(f"{key}: {usable} training prompts{capped} is fewer than one step's {which}={need}, so the "
                          f"dataloader (drop_last) would yield no batch; lower {which} or add data")
