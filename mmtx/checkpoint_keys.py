"""The entries every mmtx checkpoint holds beside Lightning's: the tasks write them, `mmtx.checkpoint`
reads them. Kept apart so that the tasks need not import the checkpoint reader."""

TASK_KEY = "mmtx_task"  # the task class's import path, written into every checkpoint
DATA_KEY = "mmtx_data"  # the resolved data config the task was trained on
