#pragma once
/// The optimizers and learning-rate schedules of hetseq. See Note [Optimizer state] and
/// Note [Per-epoch --lr lists].

#include "hetseq/optim/adadelta.h"
#include "hetseq/optim/adam.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/optim/inverse_sqrt.h"
#include "hetseq/optim/lr_scheduler.h"
#include "hetseq/optim/optimizer.h"
#include "hetseq/optim/polynomial_decay.h"
#include "hetseq/optim/sgd.h"
