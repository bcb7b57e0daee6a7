"""verl's ``verl.trainer.sft_trainer`` path: ``python -m hybridflow.trainer.sft_trainer key=value ...`` runs
:mod:`hybridflow.sft.trainer` (the SFT room) with ``fsdp_sft_trainer``'s keys."""

from hybridflow.sft.trainer import SFTTrainer, main, run_sft

__all__ = ["SFTTrainer", "main", "run_sft"]

if __name__ == "__main__":
    main()
