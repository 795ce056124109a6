"""The embedded data sets as Lightning data modules: shapes scenes with captions or questions,
and grid scenes with captions, drawn under ``root`` on first use and read back with the
official-format readers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mmtx.data.annotations import TextLimit
from mmtx.data.captions.datamodule import CaptionDataModule
from mmtx.data.captions.files import read_coco_captions
from mmtx.data.synthetic.grid import check_spec as grid_spec
from mmtx.data.synthetic.grid import generate_grid, grid_scenes
from mmtx.data.synthetic.scenes import ShapeScene
from mmtx.data.synthetic.scoring import caption_scores
from mmtx.data.synthetic.shapes import check_spec as shapes_spec
from mmtx.data.synthetic.shapes import generate_shapes, shapes_val_scenes
from mmtx.data.synthetic.shapes_vqa import check_spec as shapes_vqa_spec
from mmtx.data.synthetic.shapes_vqa import generate_shapes_vqa
from mmtx.data.vqa.datamodule import VqaDataModule
from mmtx.data.vqa.files import read_vqa


class GeneratedSplits:
    """What a data module of drawn scenes adds: its train and val splits of ``num_train`` and
    ``num_val`` scenes are generated from ``seed`` under ``root`` (once, in ``prepare_data``) and
    read like the official files they are written as.

    ``generate(root, image_size=..., **spec)`` returns each split's file arguments for ``read``;
    ``settings`` adds the subclass's generator settings (counts per image, caption kind) to ``spec``. ``draw=False`` only reads a
    data set already drawn under ``root`` (``mmtx-eval`` from a checkpoint's recorded config).
    """

    image_size: int  # the data module's
    generate: Callable[..., dict[str, tuple[Path, ...]]]
    read: Callable[..., list[Any]]
    check: Callable[..., None]  # refuses a spec ``generate`` cannot draw: at construction, not in prepare_data

    def __init__(
        self,
        root: str,
        num_train: int = 8000,
        num_val: int = 500,
        seed: int = 0,
        *,
        settings: dict[str, Any],
        draw: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        spec = dict(num_train=num_train, num_val=num_val, seed=seed, **settings)
        self.check(image_size=self.image_size, **spec)
        self.root, self.spec, self.draw = Path(root), spec, draw
        self._files: dict[str, tuple[Path, ...]] | None = None

    def prepare_data(self) -> None:
        self.files()

    def files(self) -> dict[str, tuple[Path, ...]]:
        """Each split's files, generating the data set if needed."""
        if self._files is None:
            self._files = self.generate(self.root, image_size=self.image_size, draw=self.draw, **self.spec)
        return self._files

    def has_split(self, split: str) -> bool:
        return split in ("train", "val")

    def load_records(self, split: str, skipped: list[str], limit: TextLimit) -> list[Any]:
        if split == "test":
            raise ValueError(f"the {type(self).__name__} data set has train and val splits only")
        return self.read(*self.files()[split], skipped=skipped, limit=limit)


class SceneCaptions(GeneratedSplits, CaptionDataModule):
    """Drawn scenes with captions, whose generated captions are scored against the scenes:
    ``scenes(root, split)`` recomputes the ground truth of a written split."""

    scenes: Callable[[Path, str], Mapping[int, ShapeScene]]

    def __init__(
        self, root: str, *, captions_per_image: int = 5, extra: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(root, settings={"captions_per_image": captions_per_image, **(extra or {})}, **kwargs)
        self._scenes: dict[str, Mapping[int, ShapeScene]] = {}  # ground truth of each split's images, by id

    def score_captions(self, split: str, predictions: dict[int, str]) -> dict[str, float]:
        """`mmtx.data.synthetic.scoring.caption_scores`: ``correctness``, the share of captions
        whose every stated shape, colour, size, count and relation is true of the drawn scene;
        ``relation_accuracy``, the share of the relations they state between two of its shapes
        that hold (absent when none is stated); ``relations_stated``, how many they state."""
        if split not in self._scenes:  # recomputed once per split, not at every validation
            self.files()
            self._scenes[split] = self.scenes(self.root, split)
        return caption_scores(predictions, self._scenes[split])


class ShapesCaptions(SceneCaptions):
    """The embedded default: procedurally drawn shapes scenes with five captions each."""

    generate, read, check = staticmethod(generate_shapes), staticmethod(read_coco_captions), staticmethod(shapes_spec)
    scenes = staticmethod(shapes_val_scenes)


def _generate_grid(root: Path, image_size: int, **spec: Any) -> dict[str, tuple[Path, ...]]:
    """`generate_grid`, which draws each image at its own size: ``image_size`` is the reader's."""
    return generate_grid(root, **spec)


class GridCaptions(SceneCaptions):
    """Grid scenes (`mmtx.data.synthetic.grid`) with five captions each: images of several sizes
    and aspect ratios, squashed to ``image_size`` as they are read, and relations that follow a
    3x3 grid; a second generator to measure a captioner tuned on the shapes scenes on."""

    generate, read, check = staticmethod(_generate_grid), staticmethod(read_coco_captions), staticmethod(grid_spec)
    scenes = staticmethod(grid_scenes)

    def __init__(self, root: str, *, captions: str = "relations", **kwargs: Any) -> None:
        """``captions``: ``relations`` (each caption states a relation where the scene has one)
        or ``places`` (each says where every shape stands)."""
        super().__init__(root, extra={"captions": captions}, **kwargs)


class ShapesVqa(GeneratedSplits, VqaDataModule):
    """Questions about shapes scenes, with ten annotator answers each, as VQA v2 files."""

    generate, read, check = staticmethod(generate_shapes_vqa), staticmethod(read_vqa), staticmethod(shapes_vqa_spec)

    def __init__(self, root: str, *, questions_per_image: int = 5, **kwargs: Any) -> None:
        super().__init__(root, settings={"questions_per_image": questions_per_image}, **kwargs)
