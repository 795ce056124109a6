"""Visual question answering: the VQA v2 files (`files`) and their data modules (`datamodule`)."""

from mmtx.data.vqa.datamodule import VqaDataModule, VqaV2
from mmtx.data.vqa.files import VqaRecord, read_vqa, write_vqa

__all__ = ["VqaDataModule", "VqaRecord", "VqaV2", "read_vqa", "write_vqa"]
