"""The algorithm core: messages, the algorithm and step bases, declarations, settings, the
wire format, aggregation of released replies and the learners. It imports nothing from the
trust layer (:mod:`fednovelty.federated.trust`)."""
