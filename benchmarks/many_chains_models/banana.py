"""Inference Gym's banana (float32, d = 2).

x0 ~ N(0, 10^2), x1 | x0 ~ N(0.03 (x0^2 - 100), 1).
Exact moments: mean (0, 0); sd x0 = 10, sd x1 = sqrt(1 + 0.03^2 * 2 * 10^4) = 4.3589.
"""

CURVATURE = 0.03
SCALE0 = 10.0


def logp(x):
    x0, x1 = x[0], x[1]
    return -0.5 * (x0 / SCALE0) ** 2 - 0.5 * (x1 - CURVATURE * (x0**2 - SCALE0**2)) ** 2
