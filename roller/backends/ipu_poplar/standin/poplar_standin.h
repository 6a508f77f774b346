// poplar_standin.h -- a TEST STAND-IN, not an emulator of Poplar or the IPU.
//
// It declares the handful of Poplar vertex types that roller's generated codelets use (Vertex, MultiVertex,
// Input/Output/InOut of Vector<T>) so that g++ can compile the codelets on a machine without the Poplar SDK
// and roller's host-run check can call compute() on them. There is no graph, tile memory, exchange or worker
// scheduling here: a field is a pointer and a length that the check's driver points at a copy of the slice
// the graph plan connects, and the six workers are six sequential compute(w) calls. Every element access is
// bounds-checked, so a codelet that indexes outside the slice it was given fails loudly instead of reading
// a neighbour's data.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace poplar {

namespace standin {
[[noreturn]] inline void outOfRange(std::size_t i, std::size_t size) {
  std::fprintf(stderr, "poplar stand-in: element %zu of a vector field of %zu elements\n", i, size);
  std::abort();
}
}  // namespace standin

template <class T> class Vector;

// A field connected to a slice: what a codelet sees of Input/Output/InOut<Vector<T>>.
template <class T, class Ref> class FieldSpan {
public:
  std::size_t size() const { return size_; }
  Ref &operator[](std::size_t i) const {
    if (i >= size_) standin::outOfRange(i, size_);
    return data_[i];
  }
  Ref *begin() const { return data_; }
  Ref *end() const { return data_ + size_; }
  // Used by the host-run driver only (Poplar connects fields with graph.connect).
  void rl_bind(Ref *data, std::size_t size) {
    data_ = data;
    size_ = size;
  }

private:
  Ref *data_ = nullptr;
  std::size_t size_ = 0;
};

template <class F> class Input;
template <class F> class Output;
template <class F> class InOut;

template <class T> class Input<Vector<T>> : public FieldSpan<T, const T> {};
template <class T> class Output<Vector<T>> : public FieldSpan<T, T> {};
template <class T> class InOut<Vector<T>> : public FieldSpan<T, T> {};

class Vertex {};

class MultiVertex {
public:
  static constexpr unsigned numWorkers() { return 6; }  // worker contexts per IPU tile
};

}  // namespace poplar
