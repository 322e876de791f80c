"""Statistics of a study: survival models, intervals, power, the detector's error rates.

Built on lifelines (Cox models) and scipy (intervals); hand-written code here
is only glue, or an estimator tested equal to the library's.
"""
