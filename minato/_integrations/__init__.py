"""What minato does for libraries that build or wrap loaders themselves
(Hugging Face Accelerate and transformers): each adapted only once it is
imported, and left alone where it no longer looks as expected."""
