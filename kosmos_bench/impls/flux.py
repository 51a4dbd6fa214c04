IMPLS = []
