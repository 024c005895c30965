"""Spark integration of pymq: the ``format("pymq")`` data source.

Spark finds :class:`~pyspark_pymq.spark.data_source.PymqDataSource` through
``pyspark_pymq.DefaultSource``; nothing here is imported until Spark (or the
user) asks for it, so importing this package must stay side-effect free.

One role per module, as in Spark's Kafka connector:

- :mod:`.data_source`: the ``DataSource`` (name, schema, readers).
- :mod:`.options`: option parsing and validation, once, into ``SourceOptions``.
- :mod:`.schema`: the row schema, as a Spark ``StructType`` and an Arrow schema.
- :mod:`.source_offset`: the offset JSON kept in Spark's checkpoint.
- :mod:`.offset_reader`: driver-side offset resolution against the broker.
- :mod:`.data_loss`: the one ``failOnDataLoss`` policy point.
- :mod:`.offset_range`: ranges per MessageQueue, turned into Spark partitions.
- :mod:`.micro_batch_stream`: the streaming reader (``readStream``).
- :mod:`.batch_reader`: the batch reader (``read``).
- :mod:`.read_loop`: the executor loop that pulls a range.
- :mod:`.rows`: Arrow rows <-> MessageExt (send back, listeners, reference decoding).
- :mod:`.stop`: ``query.stop()`` in the middle of a ``foreachBatch`` function (``stoppable``).

Record layouts and their decoding into Arrow belong to the backends
(:mod:`pyspark_pymq.backend`).
"""
