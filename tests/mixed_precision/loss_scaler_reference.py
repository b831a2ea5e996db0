"""DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py), re-implemented
line by line in Python as the independent reference for tests/mixed_precision/test_loss_scaler.cpp.

usage: loss_scaler_reference.py INITIAL_SCALE_POWER WINDOW HYSTERESIS CONSECUTIVE(0|1) MIN_SCALE OVERFLOWS
  OVERFLOWS: a string of 0/1, one per optimizer step (1 = the gradients overflowed).
prints one line per step: the scale after update_scale and cur_hysteresis, or "raise" where
DeepSpeed raises "Current loss scale already at minimum" (and stops).
"""
import sys


class DynamicLossScaler:
    def __init__(self, init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis

    def update_scale(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    raise RuntimeError("Current loss scale already at minimum")
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if stable_interval > 0 and stable_interval % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1


def main():
    power, window, hyst, consec, min_scale, seq = sys.argv[1:7]
    s = DynamicLossScaler(2.0 ** int(power), int(window), float(min_scale), int(hyst), consec == "1")
    for c in seq:
        try:
            s.update_scale(c == "1")
        except RuntimeError:
            print("raise")
            return
        print(repr(float(s.cur_scale)), s.cur_hysteresis)


if __name__ == "__main__":
    main()
