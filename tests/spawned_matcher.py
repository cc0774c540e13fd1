"""What a process started by multiprocessing's spawn (as Lightning's spawn-based DDP starts RF-DETR's ranks) finds
when it unpickles a matcher pickled while patched."""


def report(matcher) -> tuple:
    from rfdetr.models.matcher import HungarianMatcher

    from lucid_assign.integrations import rfdetr as lr

    return (type(matcher) is HungarianMatcher, lr.is_patched(), lr.STATE.backend,
            HungarianMatcher._match_many is lr._match_many, matcher.cost_bbox)
