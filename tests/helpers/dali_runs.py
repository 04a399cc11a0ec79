"""Running DALI pipelines that end their epochs as an external source does (``StopIteration``, then ``reset``)."""


def epochs(pipe, count, sample):
    """Each of ``count`` epochs' samples, in order: ``sample(outputs, k)`` for the k-th of each batch's outputs."""
    out = []
    for _ in range(count):
        got = []
        try:
            while True:
                outputs = pipe.run()
                got += [sample(outputs, k) for k in range(len(outputs[0]))]
        except StopIteration:
            pipe.reset()
        out.append(got)
    return out
