"""verl's ``verl.trainer.fsdp_sft_trainer`` entry point: ``python -m hybridflow.trainer.fsdp_sft_trainer key=value ...``
(or ``torchrun ... -m hybridflow.trainer.fsdp_sft_trainer ...``) runs :mod:`hybridflow.trainer.sft_trainer` with the
same keys (``data.prompt_dict_keys``, ``model.lora_rank``, ``trainer.n_gpus_per_node``, ...)."""

from hybridflow.trainer.sft_trainer import SFTTrainer, main, run_sft

__all__ = ["SFTTrainer", "main", "run_sft"]

if __name__ == "__main__":
    main()
