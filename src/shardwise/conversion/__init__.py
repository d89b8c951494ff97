"""Convert and reshard: the plan per array, the copy task, the check against the source."""
