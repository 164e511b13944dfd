#pragma once
/// hetseq's public API in one include: tasks (Task, ModelTask, Dataset, Batch, the task registry and
/// HETSEQ_REGISTER_TASK), typed metrics, errors, logging, the version, training from C++ (hetseq::train with
/// hetseq::TrainOptions) and hetseq-train's entry point. See docs/API.md,
/// which also says what may change between versions.

#include <torch/torch.h>

#include "hetseq/cli/train_command.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/data/batch.h"
#include "hetseq/data/dataset.h"
#include "hetseq/session/train.h"
#include "hetseq/task/model_task.h"
#include "hetseq/task/task.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/task/user_dir.h"
#include "hetseq/version.h"
