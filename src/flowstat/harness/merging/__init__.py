"""What a merger does with what it receives, apart from its sockets (harness.devices.merger): the
objects of one name merged as they arrive (slots), each producer's sequence checked (sequences),
a batch of messages read at once (batches)."""
