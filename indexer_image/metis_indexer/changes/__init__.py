"""What a pass changes beside the index that answers, and where its vectors come from, each
a class that takes the pass's read and embed as callables (`passing`): `chunking_change` (a
new chunking's index built beside) | `model_change` (a new embedding model's vectors made
beside), `vectors` (kept, from the peers, from the model) | `peers` (the base's other
replicas asked and answered), `passing` (what a change asks of its pass). Nothing here
imports the service."""
