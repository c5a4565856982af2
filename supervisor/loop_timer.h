// The timer interface moved below the supervisor so that the front uses the
// same one: common/timer.h (Timer, TimerSource) and http/loop_timer.h
// (LoopTimer, LoopTimerSource on a libuv loop).
#pragma once

#include "http/loop_timer.h"
